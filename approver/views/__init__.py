"""The approval side's pages, one module a section: `plans` (asking for an undo, a plan's page and its
buttons), `sign_off` (a passkey signature on a plan), `outcomes` (what nobody knows, settled by a person),
`held_calls`, `passkeys`, `policies`, and `site` (health and the lock-out page). Every view has one shape:
access check, form, one service call, render."""
