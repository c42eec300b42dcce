/*
 * scripts.c -- the Lua source of the server-side scripts (see scripts.h).
 */
#include "scripts.h"

/* Results go straight from ARGV into XADD (unpack of a slice): building a
 * table per record costs Redis about twice the XADD itself. */
const char tps_script_outcomes[] =
    "local function check(k)\n"
    "  local t = redis.call('TYPE', k)['ok']\n"
    "  if t ~= 'stream' and t ~= 'none' then\n"
    "    return redis.error_reply('WRONGTYPE key ' .. k .. ' holds a ' .. t ..\n"
    "      ', not a stream: no outcome written, none acknowledged')\n"
    "  end\n"
    "end\n"
    "local bad = check(KEYS[2]) or check(KEYS[3])\n"
    "if bad then return bad end\n"
    "if redis.acl_check_cmd and not redis.acl_check_cmd('XACK', KEYS[1], ARGV[1], '0-0') then\n"
    "  return redis.error_reply('NOPERM this user may not run XACK: no outcome written, none acknowledged')\n"
    "end\n"
    "local acks, na, i, n, last = {}, 0, 4, #ARGV, ''\n"
    "local call = redis.call\n"
    "while i <= n do\n"
    "  local kind, ack, id, nf = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])\n"
    "  local j = i + 3 + 2 * nf\n"
    "  if kind == 'R' then\n"
    "    if ARGV[2] == '0' then call('XADD', KEYS[2], '*', 'id', id, unpack(ARGV, i + 4, j))\n"
    "    else call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'id', id, unpack(ARGV, i + 4, j)) end\n"
    "  else\n"
    "    local cmd = {'XADD', KEYS[3]}\n"
    "    if ARGV[3] ~= '0' then cmd[3] = 'MAXLEN'; cmd[4] = '~'; cmd[5] = ARGV[3] end\n"
    "    cmd[#cmd + 1] = '*'; cmd[#cmd + 1] = 'id'; cmd[#cmd + 1] = id\n"
    "    for k = i + 4, j do cmd[#cmd + 1] = ARGV[k] end\n"
    "    local orig = call('XRANGE', KEYS[1], id, id)[1]\n"
    "    if orig then\n"
    "      local f = orig[2]\n"
    "      local copy = #f\n"
    "      if copy > 2000 then copy = 0; cmd[#cmd + 1] = 'entry_not_copied'; cmd[#cmd + 1] = tostring(#f / "
    "2) end\n"
    "      for k = 1, copy, 2 do cmd[#cmd + 1] = 'entry.' .. f[k]; cmd[#cmd + 1] = f[k + 1] end\n"
    "    end\n"
    "    last = call(unpack(cmd))\n"
    "  end\n"
    "  if ack == '1' then na = na + 1; acks[na] = id end\n"
    "  i = j + 1\n"
    "end\n"
    "if na == 0 then return {0, last} end\n"
    "return {call('XACK', KEYS[1], ARGV[1], unpack(acks)), last}\n";

const char tps_script_find_records[] =
    "local want = {}\n"
    "for i = 4, #ARGV do want[ARGV[i]] = true end\n"
    "local floor, limit, seen, found, last = ARGV[2], tonumber(ARGV[3]), 0, {}, '+'\n"
    "while true do\n"
    "  local page = redis.call('XREVRANGE', KEYS[1], last, floor, 'COUNT', 500)\n"
    "  if #page == 0 then return {0, found} end\n"
    "  for _, e in ipairs(page) do\n"
    "    if e[1] == floor then return {0, found} end\n"
    "    seen = seen + 1\n"
    "    if seen > limit then return {1, found} end\n"
    "    local f, id, who = e[2], nil, nil\n"
    "    for k = 1, math.min(#f, 10), 2 do\n"
    "      if f[k] == 'id' then id = f[k + 1] elseif f[k] == 'writer' then who = f[k + 1] end\n"
    "    end\n"
    "    if id and who == ARGV[1] and want[id] then want[id] = nil; found[#found + 1] = id end\n"
    "  end\n"
    "  last = '(' .. page[#page][1]\n"
    "end\n";

const char tps_script_trim[] =
    "local function less(a, b)\n"
    "  local am, as = string.match(a, '^(%d+)-(%d+)$')\n"
    "  local bm, bs = string.match(b, '^(%d+)-(%d+)$')\n"
    "  if #am ~= #bm then return #am < #bm end\n"
    "  if am ~= bm then return am < bm end\n"
    "  if #as ~= #bs then return #as < #bs end\n"
    "  return as < bs\n"
    "end\n"
    "if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then return {'', 0} end\n"
    "local minid\n"
    "for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do\n"
    "  local h = {}\n"
    "  for j = 1, #g, 2 do h[g[j]] = g[j + 1] end\n"
    "  local cand = h['last-delivered-id']\n"
    "  if h['pending'] > 0 then cand = redis.call('XPENDING', KEYS[1], h['name'])[2] end\n"
    "  if minid == nil or less(cand, minid) then minid = cand end\n"
    "end\n"
    "if minid == nil or minid == '0-0' then return {'', 0} end\n"
    "return {minid, redis.call('XTRIM', KEYS[1], 'MINID', '~', minid, 'LIMIT', ARGV[1])}\n";

const char tps_script_requeue[] =
    "local out = {}\n"
    "for _, d in ipairs(ARGV) do\n"
    "  local rec = redis.call('XRANGE', KEYS[2], d, d)[1]\n"
    "  if not rec then\n"
    "    out[#out + 1] = {d, 'gone', ''}\n"
    "  else\n"
    "    local f, cmd, orig, wide = rec[2], {'XADD', KEYS[1], '*'}, '', false\n"
    "    for j = 1, #f, 2 do\n"
    "      local name = f[j]\n"
    "      if name == 'id' then orig = f[j + 1]\n"
    "      elseif name == 'entry_not_copied' then wide = true\n"
    "      elseif string.sub(name, 1, 6) == 'entry.' and name ~= 'entry.requeued_from' then\n"
    "        cmd[#cmd + 1] = string.sub(name, 7); cmd[#cmd + 1] = f[j + 1]\n"
    "      end\n"
    "    end\n"
    "    if wide then\n"
    "      out[#out + 1] = {d, 'not_copied', ''}\n"
    "    elseif #cmd == 3 then\n"
    "      out[#out + 1] = {d, 'no_fields', ''}\n"
    "    else\n"
    "      cmd[#cmd + 1] = 'requeued_from'; cmd[#cmd + 1] = orig\n"
    "      local new = redis.call(unpack(cmd))\n"
    "      redis.call('XDEL', KEYS[2], d)\n"
    "      out[#out + 1] = {d, 'requeued', new}\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return out\n";

const char tps_script_stream_state[] =
    "if redis.call('TYPE', KEYS[1])['ok'] == 'none' then return 0 end\n"
    "local info = redis.call('XINFO', 'STREAM', KEYS[1])\n"
    "if ARGV[1] == '' then return {info, -1} end\n"
    "return {info, #redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])}\n";

const char tps_script_reap[] =
    "local out, call = {}, redis.call\n"
    "for _, x in ipairs(call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do\n"
    "  local h = {}\n"
    "  for j = 1, #x, 2 do h[x[j]] = x[j + 1] end\n"
    "  if h['name'] ~= ARGV[2] and h['pending'] == 0 and h['idle'] >= tonumber(ARGV[3]) then\n"
    "    call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], h['name'])\n"
    "    out[#out + 1] = h['name']\n"
    "  end\n"
    "end\n"
    "return out\n";

const char tps_script_let_go[] =
    "local out, call = {}, redis.call\n"
    "for i = 4, #ARGV, 3 do\n"
    "  local id, held, new = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]\n"
    "  local p = call('XPENDING', KEYS[1], ARGV[1], id, id, 1)[1]\n"
    "  local ours = p and p[2] == ARGV[2]\n"
    "  if #call('XRANGE', KEYS[1], id, id) == 0 then\n"
    "    if ours then out[#out + 1] = 'gone' elseif p then out[#out + 1] = 'other'\n"
    "    else out[#out + 1] = 'dropped' end\n"
    "  elseif ours and p[4] == held then\n"
    "    call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'IDLE', ARGV[3], 'RETRYCOUNT', new, 'JUSTID')\n"
    "    out[#out + 1] = 'given'\n"
    "  else\n"
    "    out[#out + 1] = 'other'\n"
    "  end\n"
    "end\n"
    "return out\n";

/* The hold and claim scripts' `can`: they may write a dead record and XACK
 * (the dead key is a stream or absent, and the user's ACL allows both:
 * redis.acl_check_cmd, Redis 7; skipped before). Needs `call`, `key`,
 * `dead` and `group` defined. */
#define MAY_RECORD                                                                                           \
    "local t = call('TYPE', dead)['ok']\n"                                                                   \
    "local function may(...) return not redis.acl_check_cmd or redis.acl_check_cmd(...) end\n"               \
    "local can = (t == 'stream' or t == 'none') and may('XADD', dead, '*', 'id', '0') and\n"                 \
    "  may('XACK', key, group, '0-0')\n"

/* One XPENDING (with the consumer: only ours), XRANGE and XCLAIM or XACK
 * per id: about 8 us per id in Redis (a heartbeat over 10,000 held ids took
 * 77 ms of Redis time, in 512-id calls of ~4 ms, against 32 ms for a plain
 * XCLAIM JUSTID), once every CLAIM_IDLE / 3. */
const char tps_script_hold[] =
    "local call, key, dead, group, me = redis.call, KEYS[1], KEYS[2], ARGV[1], ARGV[2]\n" MAY_RECORD
    "local recorded, acked = {}, {}\n"
    "for i = 5, #ARGV, 2 do\n"
    "  local id = ARGV[i]\n"
    "  if call('XPENDING', key, group, id, id, 1, me)[1] then\n"
    "    if #call('XRANGE', key, id, id) > 0 then\n"
    "      if ARGV[3] == '' then call('XCLAIM', key, group, me, 0, id, 'JUSTID')\n"
    "      else call('XCLAIM', key, group, me, 0, id, 'RETRYCOUNT', ARGV[3], 'JUSTID') end\n"
    "    elseif ARGV[i + 1] ~= 'R' then\n"
    "      call('XACK', key, group, id)\n"
    "      acked[#acked + 1] = id\n"
    "    elseif can then\n"
    "      local rec = {'XADD', dead, '*'}\n"
    "      if ARGV[4] ~= '0' then rec = {'XADD', dead, 'MAXLEN', '~', ARGV[4], '*'} end\n"
    "      for _, v in ipairs({'id', id, 'reason', 'entry deleted before it ran', 'consumer', me,\n"
    "                          'attempts', '0', 'deliveries', '0'}) do rec[#rec + 1] = v end\n"
    "      call(unpack(rec))\n"
    "      call('XACK', key, group, id)\n"
    "      recorded[#recorded + 1] = id\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return {recorded, acked}\n";

/* XPENDING's plain range form (bounded: its IDLE form scans the whole
 * pending list for matches), filtered here. */
const char tps_script_claim[] =
    "local call, key, dead, group, me = redis.call, KEYS[1], KEYS[2], ARGV[1], ARGV[2]\n"
    "local idle, want, scan = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6])\n" MAY_RECORD
    "local from = '-'\n"
    "if ARGV[4] ~= '0-0' then from = '(' .. ARGV[4] end\n"
    "local rows = call('XPENDING', key, group, from, '+', scan)\n"
    "local got, recorded, own, last = {}, {}, {}, nil\n"
    "for _, p in ipairs(rows) do\n"
    "  if #got + #recorded + #own >= want then break end\n"
    "  last = p[1]\n"
    "  if p[3] >= idle then\n"
    "    if #call('XRANGE', key, p[1], p[1]) > 0 then\n"
    "      local e = call('XCLAIM', key, group, me, idle, p[1])[1]\n"
    "      if e then got[#got + 1] = e end\n"
    "    elseif p[2] == me then\n"
    "      own[#own + 1] = p[1]\n"
    "    elseif can then\n"
    "      local rec = {'XADD', dead, '*'}\n"
    "      if ARGV[7] ~= '0' then rec = {'XADD', dead, 'MAXLEN', '~', ARGV[7], '*'} end\n"
    "      for _, v in ipairs({'id', p[1], 'reason', 'entry deleted before it ran', 'consumer', me,\n"
    "                          'attempts', '0', 'deliveries', '0'}) do rec[#rec + 1] = v end\n"
    "      call(unpack(rec))\n"
    "      call('XACK', key, group, p[1])\n"
    "      recorded[#recorded + 1] = p[1]\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local cursor = '0-0'\n"
    "if last and (#got + #recorded + #own >= want or #rows >= scan) then cursor = last end\n"
    "return {cursor, got, recorded, own}\n";
