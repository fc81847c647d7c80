// Workers and queues: the workers that answer a ping and what they consume, queue depths, this tenant's breakers
// that are not closed, the reconciler's last sweep (GET /v1/console/ops, every 3 s).
import {api, ApiError} from './api.js';
import {h, section, when} from './dom.js';

function table(head, rows) {
  return h('table', {}, h('thead', {}, h('tr', {}, head.map((t) => h('th', {scope: 'col', text: t})))),
    h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {text: c}))))));
}

export async function opsView(root, context) {
  const box = h('div', {id: 'ops'});
  root.replaceChildren(h('h1', {text: 'Workers and queues'}), box);
  async function load() {
    let ops;
    try { ops = await api('/v1/console/ops'); } catch (error) {
      if (error instanceof ApiError && error.status === 401) { context.unauthorized(); return; }
      box.replaceChildren(h('p', {class: 'error', role: 'alert', text: String(error.message || error)}));
      return;
    }
    const sweep = ops.reconciler.last_sweep;
    box.replaceChildren(
      section(`Workers (${ops.workers.alive.length} alive)`,
        ops.workers.alive.length ? table(['Worker', 'Queues'], ops.workers.alive.map((w) => [w.name, w.queues.join(', ')]))
          : h('p', {class: 'error', text: `No worker answered${ops.workers.error ? ` (${ops.workers.error})` : ''}.`}),
        h('p', {class: 'muted', text: `asked ${ops.workers.checked_s_ago} s ago`})),
      section('Queues', table(['Queue', 'Waiting', 'Oldest (s)'], ops.queues.map((q) => [q.queue, q.depth, q.oldest_age_s]))),
      section('Circuit breakers (yours, not closed)', ops.breakers.length
        ? table(['Tool', 'State', 'Failures in a row', 'Opened'], ops.breakers.map((b) => [b.tool, b.state, b.failures, b.opens]))
        : h('p', {class: 'muted', text: 'All closed.'})),
      section('Reconciler', h('p', {text: ops.reconciler.interval_s > 0
        ? `Sweeps every ${ops.reconciler.interval_s} s; last: ${sweep ? `${when(sweep.at)}, ${sweep.requeued} job(s) re-queued` : 'none yet'}.`
        : 'Off in this API process (TOOLRAIL_RECONCILE_INTERVAL_S=0).'})));
  }
  await load();
  const timer = setInterval(load, 3000);
  return {dispose() { clearInterval(timer); }};
}
