// Link capture of the HELLO exchange (issue 24): the HELLO and HelloReply frames of an OK HELLO,
// re-encoded from what was sent and decoded (the same bytes, with the auth field zeroed: a trace
// holds no secret material, docs/trace.md).
import type { LinkTap } from "@tapwire/trace";
import type { Hello, HelloReply } from "@tapwire/wire";
import { encodeHello, encodeHelloReply, FrameStatus, frame, Op } from "@tapwire/wire";

const NO_AUTH = new Uint8Array(32);

/** Hands the frames of an OK HELLO (`seq`, `session`) to `tap`. */
export function tapHello(tap: LinkTap, hello: Hello, session: number, seq: number, reply: HelloReply): void {
  const req = frame({ op: Op.HELLO, seq, session }, encodeHello({ ...hello, auth: NO_AUTH }));
  tap.request(req, req.length);
  const rep = frame({ op: Op.HELLO, status: FrameStatus.OK, seq, session }, encodeHelloReply(reply));
  tap.reply(rep, rep.length, 0);
}
