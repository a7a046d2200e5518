"""The one door to tool servers: every MCP exchange the project makes with a tool server goes through
`client.Upstreams` (timeouts, bounded answers, one error type), below the services. Nothing here knows the
Recorder (`journal.mcp`), the services or the approval side."""
