-- wrk script: every request notifies about a job no other request names.
local counter = 0
local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  counter = tid * 100000000
end

function request()
  counter = counter + 1
  local body = "scrapingjob_id=" .. counter .. "&status=finished&sitemap_id=1&sitemap_name=products"
  return wrk.format("POST", nil, {["Content-Type"] = "application/x-www-form-urlencoded"}, body)
end

function done(summary, latency, requests)
  io.write(string.format(
    'WRK {"requests": %d, "duration_us": %d, "non2xx": %d, "errors": %d, "p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
