-- wrk script: every request notifies about the same job (Cloud's repeats, many at once).
wrk.method = "POST"
wrk.body = "scrapingjob_id=424242&status=finished&sitemap_id=1&sitemap_name=products"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"

function done(summary, latency, requests)
  io.write(string.format(
    'WRK {"requests": %d, "duration_us": %d, "non2xx": %d, "errors": %d, "p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
