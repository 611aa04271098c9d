import type { NetworkInterfaceInfo } from "node:os";
import { describe, expect, it } from "vitest";
import { advertiseEndpoint, isWildcardHost, parseAdvertise, StatsError } from "../src/index.js";

// Issue 19: the one advertised-address rule of every tapwire bin (see src/advertise.ts).
const lo: NetworkInterfaceInfo[] = [
  {
    address: "127.0.0.1",
    netmask: "255.0.0.0",
    family: "IPv4",
    mac: "00:00:00:00:00:00",
    internal: true,
    cidr: "127.0.0.1/8",
  },
  {
    address: "::1",
    netmask: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    family: "IPv6",
    mac: "00:00:00:00:00:00",
    internal: true,
    cidr: "::1/128",
    scopeid: 0,
  },
];
const v6only: NetworkInterfaceInfo[] = [
  {
    address: "fe80::1",
    netmask: "ffff:ffff:ffff:ffff::",
    family: "IPv6",
    mac: "02:00:00:00:00:01",
    internal: false,
    cidr: "fe80::1/64",
    scopeid: 4,
  },
  {
    address: "fd00::5",
    netmask: "ffff:ffff:ffff:ffff::",
    family: "IPv6",
    mac: "02:00:00:00:00:01",
    internal: false,
    cidr: "fd00::5/64",
    scopeid: 0,
  },
];
const v4: NetworkInterfaceInfo[] = [
  {
    address: "10.9.0.2",
    netmask: "255.255.255.0",
    family: "IPv4",
    mac: "02:00:00:00:00:02",
    internal: false,
    cidr: "10.9.0.2/24",
  },
];

function code(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(StatsError);
    return (e as StatsError).code;
  }
  return undefined;
}

describe("advertiseEndpoint (issue 19)", () => {
  it("a non-wildcard bind is announced as bound; --advertise replaces the host and, if given, the port", () => {
    expect(advertiseEndpoint("tls://10.0.0.5:5601")).toMatchObject({
      endpoint: "tls://10.0.0.5:5601",
      source: "bind",
    });
    expect(advertiseEndpoint("tls://0.0.0.0:5601", { advertise: "enc.example" })).toMatchObject({
      endpoint: "tls://enc.example:5601",
      bind: "tls://0.0.0.0:5601",
      source: "advertise",
    });
    expect(advertiseEndpoint("tcp://[::]:7878", { advertise: "[fd00::5]:9000" }).endpoint).toBe(
      "tcp://[fd00::5]:9000",
    );
    expect(advertiseEndpoint("unix:///run/x.sock", { advertise: "h" }).endpoint).toBe("unix:///run/x.sock");
  });

  it("a wildcard without --advertise takes the first non-loopback interface that is up", () => {
    const ifs = () => ({ lo, eth0: v6only, eth1: v4 });
    expect(advertiseEndpoint("tls://0.0.0.0:5601", { interfaces: ifs })).toMatchObject({
      endpoint: "tls://10.9.0.2:5601",
      source: "interface",
      interfaceName: "eth1",
    });
    // :: takes IPv4 first, then IPv6, never link-local
    expect(advertiseEndpoint("tcp://[::]:1", { interfaces: () => ({ lo, eth0: v6only }) }).endpoint).toBe(
      "tcp://[fd00::5]:1",
    );
    expect(advertiseEndpoint("tcp://*:1", { interfaces: ifs }).endpoint).toBe("tcp://10.9.0.2:1");
  });

  it("a wildcard with no usable interface is a usage error naming --advertise", () => {
    expect(code(() => advertiseEndpoint("tls://0.0.0.0:5601", { interfaces: () => ({ lo }) }))).toBe(
      "STATS_NO_ADVERTISE",
    );
    expect(
      code(() => advertiseEndpoint("tls://0.0.0.0:5601", { interfaces: () => ({ lo, eth0: v6only }) })),
    ).toBe("STATS_NO_ADVERTISE");
    try {
      advertiseEndpoint("tcp://0.0.0.0:1", { interfaces: () => ({}) });
    } catch (e) {
      expect((e as Error).message).toMatch(/--advertise HOST\[:PORT\]/);
    }
  });

  it("parseAdvertise refuses wildcards, bad hosts and ports, naming --advertise", () => {
    expect(parseAdvertise("10.0.0.5:5601")).toEqual({ host: "10.0.0.5", port: 5601 });
    expect(parseAdvertise("fd00::5")).toEqual({ host: "fd00::5" });
    for (const bad of [
      "",
      "0.0.0.0",
      "[::]",
      "*",
      "1.2.3:4",
      "h:0",
      "h:70000",
      "[zz]:1",
      "a b",
      "tcp://h:1",
    ]) {
      expect(
        code(() => parseAdvertise(bad)),
        bad,
      ).toBe("STATS_BAD_ADVERTISE");
    }
    expect(() => parseAdvertise("0.0.0.0")).toThrow(/--advertise/);
    expect(isWildcardHost("[::]")).toBe(true);
    expect(isWildcardHost("127.0.0.1")).toBe(false);
  });
});
