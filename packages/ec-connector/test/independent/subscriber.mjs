// A residency subscriber written from EC-CONTRACT 10 alone, as a new user would: plain Node, the
// `zeromq` package and a MessagePack decoder/encoder written here from the MessagePack spec
// (https://github.com/msgpack/msgpack/blob/master/spec.md). It imports nothing from tapwire, so a
// test that compares its view with a producer's cache proves the wire format, not tapwire's codec.
import { randomUUID } from "node:crypto";
import { Dealer, Subscriber } from "zeromq";

// ---- MessagePack, the subset the contract uses ---------------------------------------------------

/** Decodes one MessagePack value from `buf` (a Buffer); throws on anything malformed or trailing. */
export function decode(buf) {
  let p = 0;
  const need = (n) => {
    if (p + n > buf.length) throw new Error("truncated");
  };
  const str = (n) => {
    need(n);
    const s = buf.toString("utf8", p, p + n);
    p += n;
    return s;
  };
  const read = (depth) => {
    if (depth > 8) throw new Error("too deep");
    need(1);
    const t = buf[p++];
    if (t <= 0x7f) return t;
    if (t >= 0xe0) return t - 0x100;
    if (t >= 0xa0 && t <= 0xbf) return str(t & 0x1f);
    if (t >= 0x90 && t <= 0x9f) return arr(t & 0x0f, depth);
    if (t >= 0x80 && t <= 0x8f) return map(t & 0x0f, depth);
    switch (t) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xcc:
        need(1);
        return buf[p++];
      case 0xcd:
        need(2);
        p += 2;
        return buf.readUInt16BE(p - 2);
      case 0xce:
        need(4);
        p += 4;
        return buf.readUInt32BE(p - 4);
      case 0xcf: {
        need(8);
        p += 8;
        const v = buf.readBigUInt64BE(p - 8);
        if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error("integer beyond 2^53");
        return Number(v);
      }
      case 0xd0:
        need(1);
        return buf.readInt8(p++);
      case 0xd1:
        need(2);
        p += 2;
        return buf.readInt16BE(p - 2);
      case 0xd2:
        need(4);
        p += 4;
        return buf.readInt32BE(p - 4);
      case 0xd3: {
        need(8);
        p += 8;
        return Number(buf.readBigInt64BE(p - 8));
      }
      case 0xd9:
        need(1);
        return str(buf[p++]);
      case 0xda:
        need(2);
        p += 2;
        return str(buf.readUInt16BE(p - 2));
      case 0xdb:
        need(4);
        p += 4;
        return str(buf.readUInt32BE(p - 4));
      case 0xdc:
        need(2);
        p += 2;
        return arr(buf.readUInt16BE(p - 2), depth);
      case 0xdd:
        need(4);
        p += 4;
        return arr(buf.readUInt32BE(p - 4), depth);
      case 0xde:
        need(2);
        p += 2;
        return map(buf.readUInt16BE(p - 2), depth);
      case 0xdf:
        need(4);
        p += 4;
        return map(buf.readUInt32BE(p - 4), depth);
      default:
        throw new Error(`type 0x${t.toString(16)} not used by the contract`);
    }
  };
  const arr = (n, depth) => {
    if (n > buf.length - p) throw new Error("array longer than the message");
    const out = [];
    for (let i = 0; i < n; i++) out.push(read(depth + 1));
    return out;
  };
  const map = (n, depth) => {
    if (2 * n > buf.length - p) throw new Error("map longer than the message");
    const out = {};
    for (let i = 0; i < n; i++) {
      const k = read(depth + 1);
      if (typeof k !== "string") throw new Error("non-string key");
      out[k] = read(depth + 1);
    }
    return out;
  };
  const v = read(0);
  if (p !== buf.length) throw new Error("trailing bytes");
  return v;
}

/** Encodes a flat map of strings and non-negative integers (a replay request). */
export function encodeFlat(obj) {
  const parts = [];
  const keys = Object.keys(obj);
  parts.push(Buffer.from([0x80 | keys.length]));
  const s = (x) => {
    const b = Buffer.from(x, "utf8");
    if (b.length < 32) parts.push(Buffer.from([0xa0 | b.length]));
    else if (b.length < 256) parts.push(Buffer.from([0xd9, b.length]));
    else parts.push(Buffer.from([0xda, b.length >> 8, b.length & 0xff]));
    parts.push(b);
  };
  const u = (n) => {
    if (n < 128) parts.push(Buffer.from([n]));
    else if (n < 2 ** 32) {
      const b = Buffer.alloc(5);
      b[0] = 0xce;
      b.writeUInt32BE(n, 1);
      parts.push(b);
    } else {
      const b = Buffer.alloc(9);
      b[0] = 0xcf;
      b.writeBigUInt64BE(BigInt(n), 1);
      parts.push(b);
    }
  };
  for (const k of keys) {
    s(k);
    const v = obj[k];
    if (typeof v === "string") s(v);
    else u(v);
  }
  return Buffer.concat(parts);
}

// ---- The subscriber (EC-CONTRACT 10.3) ------------------------------------------------------------

const isEvent = (m) =>
  m !== null &&
  typeof m === "object" &&
  typeof m.incarnation === "string" &&
  Number.isSafeInteger(m.seq) &&
  typeof m.kind === "string";

/**
 * Follows one producer: SUB on its events endpoint, DEALER on its replay endpoint. `dropLive` and
 * `dropReply` are the fractions of received messages thrown away before they are looked at (the
 * lossy network of the test). `stats` counts what happened.
 */
export class IndependentSubscriber {
  constructor(events, replay, { dropLive = 0, dropReply = 0, random = Math.random } = {}) {
    this.incarnation = "";
    this.seq = 0;
    this.set = new Set();
    this.trusted = false;
    this.heartbeatMs = 2000;
    this.stats = {
      live: 0,
      dropped: 0,
      gaps: 0,
      replays: 0,
      snapshots: 0,
      asks: 0,
      resyncs: 0,
      malformed: 0,
    };
    this.onResync = null; // called after each replay or snapshot closed a gap
    this.held = new Map(); // live messages kept while a gap is being closed
    this.req = null; // {id, at, pages: Set|null, snapSeq, nextPage, snapDone, broken}
    this.lastAsk = -Infinity;
    this.random = random;
    this.dropLive = dropLive;
    this.dropReply = dropReply;
    this.sub = new Subscriber({ linger: 0 });
    this.sub.subscribe();
    this.sub.connect(events);
    this.dealer = new Dealer({ linger: 0 });
    this.dealer.connect(replay);
    this.closed = false;
    this.timer = setInterval(() => this.tick(), 50);
    void this.loop(this.sub, (m) => this.live(m), dropLive);
    void this.loop(this.dealer, (m) => this.reply(m), dropReply);
    this.ask(); // a subscriber with no view asks at once: snapshot or replay
  }

  async loop(sock, fn, drop) {
    try {
      for await (const frames of sock) {
        if (this.closed) return;
        if (drop > 0 && this.random() < drop) {
          this.stats.dropped++;
          continue;
        }
        let m;
        try {
          if (frames.length !== 1) throw new Error("multipart");
          m = decode(frames[0]);
          if (!isEvent(m)) throw new Error("not an event map");
        } catch {
          this.stats.malformed++;
          continue;
        }
        fn(m);
      }
    } catch {
      /* socket closed */
    }
  }

  apply(m) {
    this.seq = m.seq;
    if (m.kind === "hello" && Number.isSafeInteger(m.heartbeat_ms)) this.heartbeatMs = m.heartbeat_ms;
    if (m.kind === "stored") for (const h of m.mm_hashes) this.set.add(h);
    if (m.kind === "evicted") for (const h of m.mm_hashes) this.set.delete(h);
  }

  live(m) {
    if ("request_id" in m) return;
    this.stats.live++;
    if (m.incarnation !== this.incarnation) {
      // A new incarnation starts empty; its seq 1 is the whole story from the start.
      const hadView = this.incarnation !== "";
      this.incarnation = m.incarnation;
      this.set = new Set();
      this.seq = 0;
      this.held.clear();
      if (m.seq === 1) {
        this.apply(m);
        this.trusted = true;
        this.req = null;
        return;
      }
      this.trusted = false;
      this.held.set(m.seq, m);
      if (hadView || this.req === null) this.ask();
      return;
    }
    if (m.seq <= this.seq) return;
    if (this.trusted && m.seq === this.seq + 1) {
      this.apply(m);
      return;
    }
    this.held.set(m.seq, m);
    if (this.trusted) {
      this.stats.gaps++;
      this.trusted = false;
      this.ask();
    }
  }

  reply(m) {
    const r = this.req;
    if (r === null || m.request_id !== r.id) return;
    if (m.incarnation !== this.incarnation) {
      this.incarnation = m.incarnation;
      this.set = new Set();
      this.seq = 0;
      for (const [s, h] of this.held) if (h.incarnation !== m.incarnation) this.held.delete(s);
    }
    if (m.kind === "snapshot") {
      if (m.page === r.nextPage && (r.pages === null || m.seq === r.snapSeq)) {
        r.pages ??= new Set();
        r.snapSeq = m.seq;
        for (const h of m.mm_hashes) r.pages.add(h);
        r.nextPage++;
        r.snapDone = m.more === false;
      } else r.broken = true;
      return;
    }
    if (m.kind !== "end") {
      if (r.pages !== null) r.broken = true;
      else if (m.seq === this.seq + 1) this.apply(m);
      else if (m.seq > this.seq + 1) r.broken = true;
      return;
    }
    if (Number.isSafeInteger(m.heartbeat_ms)) this.heartbeatMs = m.heartbeat_ms;
    this.req = null;
    if (r.pages !== null) {
      if (!r.snapDone || r.snapSeq !== m.seq || r.broken) return this.later();
      this.set = r.pages;
      this.seq = r.snapSeq;
      this.stats.snapshots++;
    } else {
      if (r.broken || this.seq !== m.seq) return this.later();
      this.stats.replays++;
    }
    for (const s of [...this.held.keys()]) if (s <= this.seq) this.held.delete(s);
    while (this.held.has(this.seq + 1)) {
      const h = this.held.get(this.seq + 1);
      this.held.delete(h.seq);
      this.apply(h);
    }
    if (this.held.size > 0) return this.later();
    this.trusted = true;
    this.stats.resyncs++;
    this.onResync?.(this);
  }

  later() {
    this.req = { id: null, at: performance.now(), due: true };
  }

  tick() {
    if (this.trusted || this.closed) return;
    const now = performance.now();
    // Ask again at most once per heartbeat_ms (EC-CONTRACT 10.2), when an answer was broken or lost.
    if (
      (this.req === null || this.req.due === true || now - this.req.at >= this.heartbeatMs) &&
      now - this.lastAsk >= this.heartbeatMs
    ) {
      this.ask();
    }
  }

  ask() {
    const id = randomUUID();
    this.req = {
      id,
      at: performance.now(),
      pages: null,
      snapSeq: -1,
      nextPage: 0,
      snapDone: false,
      broken: false,
    };
    this.lastAsk = performance.now();
    this.stats.asks++;
    const msg = encodeFlat({ request_id: id, incarnation: this.incarnation, since: this.seq });
    // zeromq allows one send in flight per socket: chain them.
    this.sending = (this.sending ?? Promise.resolve())
      .then(() => this.dealer.send(msg))
      .catch(() => undefined);
  }

  close() {
    this.closed = true;
    clearInterval(this.timer);
    this.sub.close();
    this.dealer.close();
  }
}
