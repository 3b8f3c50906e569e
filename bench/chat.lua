-- small non-streaming chat completion POST (16 output tokens), as in the peer kit; prints a JSON summary line
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
-- PACE_MS (0: none): the mean wait before each request on a connection (uniform over twice it, in
-- whole ms, so that the connections do not fall into step), to hold a rate below saturation.
local pace = tonumber(os.getenv("PACE_MS") or "0") or 0
if pace > 0 then
  math.randomseed(1)
  function delay() return math.random(0, math.floor(2 * pace + 0.5)) end
end
wrk.body = '{"model":"mock-model","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello, how are you today? Please answer briefly."}],"max_tokens":16}'
function done(summary, latency, requests)
  io.write(string.format("JSON {\"requests\":%d,\"duration_s\":%.3f,\"rps\":%.1f,\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"errors_connect\":%d,\"errors_read\":%d,\"errors_write\":%d,\"errors_status\":%d,\"errors_timeout\":%d}\n",
    summary.requests, summary.duration/1e6, summary.requests/(summary.duration/1e6),
    latency:percentile(50)/1000, latency:percentile(90)/1000, latency:percentile(99)/1000, latency.max/1000,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status, summary.errors.timeout))
end
