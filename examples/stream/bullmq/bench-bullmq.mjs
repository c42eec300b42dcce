// bench-bullmq.mjs -- BullMQ's jobs/s for a no-op job, the comparison point of
// examples/stream/bench.sh.
//
//   node bench-bullmq.mjs <redis unix socket> <jobs> <concurrency>
//
// Adds the jobs with addBulk (1,000 per call), then starts one Worker with the
// given concurrency whose processor does nothing, and counts 'completed'
// events until every job is done. Prints one JSON line.
import { Queue, Worker } from 'bullmq';

const [path, jobsArg, concArg] = process.argv.slice(2);
const jobs = Number(jobsArg || 20000);
const concurrency = Number(concArg || 4);
const connection = { path, maxRetriesPerRequest: null };
const name = 'bench';

const queue = new Queue(name, { connection });
await queue.obliterate({ force: true });

let t0 = process.hrtime.bigint();
for (let i = 0; i < jobs; i += 1000) {
  const n = Math.min(1000, jobs - i);
  await queue.addBulk(Array.from({ length: n }, (_, k) => ({ name: 'noop', data: { i: i + k } })));
}
const addSeconds = Number(process.hrtime.bigint() - t0) / 1e9;

let done = 0;
let finish;
const finished = new Promise((resolve) => { finish = resolve; });
t0 = process.hrtime.bigint();
const worker = new Worker(name, async () => {}, { connection, concurrency });
worker.on('completed', () => { if (++done === jobs) finish(); });
worker.on('failed', (job, err) => { console.error('failed', job && job.id, err); });
await finished;
const runSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
await worker.close();
await queue.close();
console.log(JSON.stringify({
  bullmq: true, jobs, concurrency,
  add_per_s: Math.round(jobs / addSeconds),
  seconds: Number(runSeconds.toFixed(3)),
  jobs_per_s: Math.round(jobs / runSeconds),
}));
process.exit(0);
