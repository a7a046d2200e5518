"""What the product tells the people who run it: Prometheus metrics (`metrics`), OpenTelemetry traces in the
MCP semantic conventions (`tracing`, and `calls` for an agent's call), and JSON log lines with the trace,
run, step, plan and agent they belong to, secrets struck out (`logs`)."""
