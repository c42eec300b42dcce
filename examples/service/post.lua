-- post.lua -- wrk script: POST /tasks as fast as wrk can, to overload the
-- task pool and watch it answer 202 or 503 (+ Retry-After) without growing.
--
--   wrk -t2 -c64 -d10s -s examples/service/post.lua 'http://127.0.0.1:8080/tasks?delay=50ms'
--
-- At the end it prints how many answers of each status wrk received.
wrk.method = "POST"

counts = {}  -- per thread (each wrk thread has its own Lua state)

function response(status, headers, body)
   counts[status] = (counts[status] or 0) + 1
end

local threads = {}
function setup(thread)
   table.insert(threads, thread)
end

function done(summary, latency, requests)
   local total = {}
   for _, t in ipairs(threads) do
      for status, n in pairs(t:get("counts")) do
         total[status] = (total[status] or 0) + n
      end
   end
   local keys = {}
   for status in pairs(total) do table.insert(keys, status) end
   table.sort(keys)
   for _, status in ipairs(keys) do
      io.write(string.format("status %d: %d\n", status, total[status]))
   end
end
