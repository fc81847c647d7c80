// The jobs list: the tenant's recent jobs, live over /v1/console/events (one stream for the whole list).
import {ApiError, stream} from './api.js';
import {age, badge, h} from './dom.js';

const STATUSES = ['queued', 'deciding', 'validating', 'running', 'awaiting_approval', 'succeeded', 'failed',
  'needs_review', 'cancelled', 'expired'];

export async function jobsView(root, context) {
  const jobs = new Map();
  const params = new URLSearchParams(location.hash.split('?')[1] || '');
  const status = h('select', {id: 'status-filter', onchange: render},
    h('option', {value: '', text: 'all statuses'}), STATUSES.map((s) => h('option', {value: s, text: s})));
  status.value = params.get('status') || '';
  const search = h('input', {id: 'search', type: 'search', placeholder: 'job id or request id', oninput: render});
  const body = h('tbody', {id: 'jobs-body'});
  const empty = h('p', {class: 'muted', id: 'jobs-empty'});
  root.replaceChildren(h('section', {class: 'card'},
    h('h1', {text: 'Jobs'}),
    h('div', {class: 'filters'},
      h('label', {for: 'status-filter', text: 'Status'}), status,
      h('label', {for: 'search', text: 'Search'}), search),
    h('table', {class: 'jobs'},
      h('thead', {}, h('tr', {}, ['Status', 'Job', 'Request', 'Tools', 'Tenant', 'Age', 'Waiting'].map((t) => h('th', {scope: 'col', text: t})))),
      body),
    empty));

  function render() {
    const wanted = status.value;
    const query = search.value.trim().toLowerCase();
    const rows = [...jobs.values()]
      .filter((j) => !wanted || j.status === wanted)
      .filter((j) => !query || j.job_id.toLowerCase().includes(query) || String(j.request_id).toLowerCase().includes(query))
      .sort((a, b) => b.created_at - a.created_at)
      .map((j) => h('tr', {dataset: {jobId: j.job_id, status: j.status}},
        h('td', {}, badge(j.status)),
        h('td', {}, h('a', {href: `#/jobs/${encodeURIComponent(j.job_id)}`, class: 'mono', text: j.job_id})),
        h('td', {class: 'mono', text: j.request_id}),
        h('td', {text: (j.tools || []).join(', ') || '–'}),
        h('td', {text: j.tenant}),
        h('td', {text: age(j.created_at), title: new Date(j.created_at * 1000).toISOString()}),
        h('td', {text: (j.awaiting || []).join(', ')})));
    body.replaceChildren(...rows);
    if (rows.length) empty.replaceChildren();
    else if (query && /^job_[\w-]+$/.test(query)) {
      empty.replaceChildren('Not among the recent jobs: ', h('a', {href: `#/jobs/${encodeURIComponent(search.value.trim())}`, text: `open ${search.value.trim()}`}));
    } else empty.replaceChildren(jobs.size ? 'No job matches.' : 'No jobs yet.');
  }

  const controller = new AbortController();
  const ticker = setInterval(render, 5000);
  let stopped = false;
  async function follow() {
    while (!stopped) {
      try {
        context.live('● live');
        await stream('/v1/console/events?limit=100', (type, data) => {
          if (type === 'snapshot') {
            jobs.clear();
            for (const j of data.jobs) jobs.set(j.job_id, j);
          } else if (type === 'job') {
            jobs.set(data.job_id, data);
          }
          render();
        }, {signal: controller.signal});
      } catch (error) {
        if (stopped) return;
        if (error instanceof ApiError && error.status === 401) { context.unauthorized(); return; }
      }
      if (stopped) return;
      context.live('○ reconnecting');
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
  follow();
  render();
  return {dispose() { stopped = true; controller.abort(); clearInterval(ticker); }};
}
