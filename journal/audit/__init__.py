"""The audit stream: every entry of every run's record (approvals included: they are entries), sent as it
is committed to the company's SIEM (`sinks`: syslog, a signed webhook, OTLP logs), at least once and in
order per run, resumed after a restart from the last entry delivered (`stream`), its lag on `/metrics`
(`lag`)."""
