#!/usr/bin/env bash
# The workspace's path of `tapwire-make-certs` (the bin of @tapwire/transport, issue 19): npm
# users run `npx tapwire-make-certs` or node_modules/.bin/tapwire-make-certs, with the same arguments.
exec bash "$(dirname "$0")/../packages/transport/bin/tapwire-make-certs.sh" "$@"
