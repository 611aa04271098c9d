// typedoc plugin: the keys of a documented `as const` table (`export const OP = { HELLO: 1, … }
// as const`) are documented by the table, as the style guide writes them; typedoc would
// otherwise report every key of every table as an undocumented Property. Each such key without a
// comment of its own gets "Entry of `TABLE`." so validation.notDocumented still catches every
// undocumented export, interface member, class member and function.
import { Comment, Converter, ReflectionKind, ReflectionType } from "typedoc";

/** @param {import("typedoc").Application} app */
export function load(app) {
  app.converter.on(Converter.EVENT_RESOLVE_BEGIN, (context) => {
    for (const v of context.project.getReflectionsByKind(ReflectionKind.Variable)) {
      if (!v.flags.isConst || !v.hasComment() || !(v.type instanceof ReflectionType)) continue;
      const walk = (decl, trail) => {
        for (const child of decl.children ?? []) {
          const name = `${trail}.${child.name}`;
          if (!child.hasComment())
            child.comment = new Comment([
              { kind: "code", text: `\`${name}\`` },
              { kind: "text", text: ": entry of the table." },
            ]);
          if (child.type instanceof ReflectionType) walk(child.type.declaration, name);
        }
      };
      walk(v.type.declaration, v.name);
    }
  });
}
