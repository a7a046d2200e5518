"""Sample tool servers: real MCP servers over streamable HTTP that speak the three undo dialects.

They are part of the demo and of the tests, never of the product: each keeps a ledger of the changes it
really made, and tests read that ledger (not our database) to decide what happened.
"""
