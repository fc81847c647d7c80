// One job: its decisions waiting for a person first, then the outcome, the conversation, every step (attempts,
// cleaning steps, findings, grounding, calls with arguments and results), webhook deliveries. Live over the job's
// own event stream (GET /v1/jobs/{id}/events).
import {api, ApiError, stream, tools as loadTools} from './api.js';
import {approvalCard, provenanceTable, reviewPanel} from './approve.js';
import {add, badge, h, json, section, TERMINAL, when} from './dom.js';

function meta(rows) {
  return h('dl', {class: 'meta'}, rows.filter(([, v]) => v !== undefined && v !== null && v !== '')
    .map(([k, v]) => [h('dt', {text: k}), h('dd', {}, v instanceof Node ? v : String(v))]));
}

function content(value) {
  if (value === null || value === undefined) return h('span', {class: 'muted', text: '(none)'});
  if (typeof value === 'string') return h('pre', {class: 'text', text: value});
  if (Array.isArray(value)) return value.map((part) => (part && part.type === 'text' ? h('pre', {class: 'text', text: part.text}) : json(part)));
  return json(value);
}

function conversation(messages) {
  if (!messages || !messages.length) return h('p', {class: 'muted', text: 'No conversation: the client brought its own calls.'});
  return h('ol', {class: 'conversation'}, messages.map((m) => h('li', {class: `message role-${String(m.role).replace(/\W/g, '')}`},
    h('div', {class: 'role'}, String(m.role), m.tool_call_id ? h('span', {class: 'mono muted', text: ` ← ${m.tool_call_id}`}) : null),
    content(m.content),
    (m.tool_calls || []).map((c) => h('div', {class: 'proposed'}, h('code', {text: `${(c.function || c).name}(`}),
      h('pre', {class: 'json', text: typeof (c.function || c).arguments === 'string' ? (c.function || c).arguments : JSON.stringify((c.function || c).arguments, null, 2)}),
      h('code', {text: ')'}))))));
}

function attempt(a) {
  return h('details', {class: 'attempt', open: (a.errors || []).length > 0 || (a.findings || []).length > 0},
    h('summary', {}, `attempt ${a.attempt} (${a.source})`, (a.errors || []).length ? ` — ${a.errors.length} error(s)` : ' — ok',
      (a.repairs || []).length ? `, ${a.repairs.length} cleaning step(s)` : ''),
    a.raw_output !== undefined ? [h('h4', {text: 'Raw output'}), h('pre', {class: 'text', text: String(a.raw_output)})] : null,
    (a.repairs || []).length ? [h('h4', {text: 'Cleaning steps'}), h('ul', {class: 'repairs'}, a.repairs.map((r) => h('li', {text: r})))] : null,
    (a.errors || []).length ? [h('h4', {text: 'Check errors'}), h('ul', {class: 'findings'}, a.errors.map((e) => h('li', {},
      e.tool ? h('strong', {text: `${e.tool} `}) : null, h('code', {text: e.path || '/'}), ' ', String(e.message))))] : null,
    (a.findings || []).length ? [h('h4', {text: 'Findings'}), h('ul', {class: 'findings'}, a.findings.map((f) => h('li', {},
      h('code', {text: f.path || '/'}), ' ', String(f.message || JSON.stringify(f)))))] : null,
    a.platform ? [h('h4', {text: 'Grounding'}), meta(Object.entries(a.platform))] : null,
    a.usage && Object.keys(a.usage).length ? meta(Object.entries(a.usage)) : null);
}

function call(c) {
  const approval = c.approval;
  return h('li', {class: 'call', dataset: {callId: c.id, status: c.status}},
    h('div', {class: 'call-head'}, badge(c.status), h('code', {text: ` [${c.index}] ${c.name}`}),
      c.duration_s ? h('span', {class: 'muted', text: ` ${(c.duration_s * 1000).toFixed(1)} ms`}) : null,
      c.attempts > 1 ? h('span', {class: 'muted', text: ` ${c.attempts} attempts`}) : null),
    h('h4', {text: 'Arguments'}), json(c.arguments),
    (c.repairs || []).length ? [h('h4', {text: 'Cleaning steps'}), h('ul', {class: 'repairs'}, c.repairs.map((r) => h('li', {text: r})))] : null,
    approval ? [h('h4', {text: 'Approval'}), meta([['state', approval.state], ['required by', approval.required_by],
      ['by', approval.by], ['reason', approval.reason], ['edited', approval.edited ? 'yes' : undefined],
      ['untrusted', (approval.untrusted || []).join(', ')]]), provenanceTable(approval),
    approval.original_arguments ? [h('h4', {text: 'Arguments as proposed'}), json(approval.original_arguments)] : null] : null,
    c.result !== null && c.result !== undefined ? [h('h4', {text: 'Result'}), json(c.result, 'json result')] : null,
    c.error ? [h('h4', {text: 'Error'}), h('p', {class: 'error'}, h('strong', {text: String(c.error.type)}), ' ', String(c.error.message || '')),
      c.error.details ? json(c.error.details) : null] : null);
}

function step(s) {
  return h('section', {class: 'card step'},
    h('h3', {}, `Step ${s.index} `, badge(s.status || 'running'), s.decided_by ? h('span', {class: 'muted', text: ` decided by ${s.decided_by}`}) : null),
    (s.attempts || []).map(attempt),
    s.review ? [h('h4', {text: 'Review'}), json(s.review)] : null,
    (s.calls || []).length ? h('ol', {class: 'calls'}, s.calls.map(call)) : null,
    s.content ? [h('h4', {text: 'Answer'}), h('pre', {class: 'text', text: s.content})] : null);
}

function webhooks(list) {
  if (!list) return null;
  return section('Webhook deliveries', list.length ? h('table', {class: 'webhooks'},
    h('thead', {}, h('tr', {}, ['Event', 'URL', 'State', 'Attempts'].map((t) => h('th', {scope: 'col', text: t})))),
    h('tbody', {}, list.map((d) => h('tr', {},
      h('td', {text: d.event || d.type || ''}), h('td', {class: 'mono', text: d.url || ''}),
      h('td', {text: [d.state, d.outcome].filter(Boolean).join(' / ')}),
      h('td', {}, (d.attempts || []).map((a) => h('div', {class: 'mono', text: JSON.stringify(a)}))))))) :
    h('p', {class: 'muted', text: 'None yet.'}));
}

export async function jobView(root, context, jobId) {
  const [first, tools] = await Promise.all([api(`/v1/jobs/${encodeURIComponent(jobId)}`), loadTools()]);
  const cards = new Map();
  let review = null;
  let job = first;

  // Four boxes, filled once each: an update never moves the cards a person may be typing in (no lost focus).
  const headBox = h('div');
  const approvalsBox = h('div', {id: 'approvals'});
  const reviewBox = h('div');
  const restBox = h('div');
  root.replaceChildren(headBox, approvalsBox, reviewBox, restBox);

  function render() {
    const pending = (job.calls || []).filter((c) => c.status === 'awaiting_approval' && (c.approval || {}).state === 'pending');
    const keep = new Set(pending.map((c) => c.id));
    for (const [id, card] of [...cards.entries()]) if (!keep.has(id)) { card.remove(); cards.delete(id); }
    for (const c of pending) {
      if (!cards.has(c.id)) {
        cards.set(c.id, approvalCard(job, c, tools.get(c.name)));
        approvalsBox.append(cards.get(c.id));
      }
    }
    if (job.status !== 'needs_review') {
      if (review) reviewBox.replaceChildren();
      review = null;
    } else if (!review || review.step !== job.step) {
      review = {step: job.step, panel: reviewPanel(job, tools)};
      reviewBox.replaceChildren(review.panel);
    }
    const outcome = job.error && job.status !== 'succeeded'
      ? h('div', {class: 'error', role: job.status === 'failed' ? 'alert' : null},
        h('p', {}, h('strong', {id: 'error-type', text: String(job.error.type)}), ' ', String(job.error.message || '')),
        job.error.details ? json(job.error.details) : null)
      : job.content ? h('pre', {class: 'text', id: 'answer', text: job.content})
        : h('p', {class: 'muted', text: TERMINAL.has(job.status) ? 'No text answer.' : 'Not finished yet.'});
    headBox.replaceChildren(h('section', {class: 'card head'},
      h('p', {}, h('a', {href: '#/jobs', text: '← Jobs'}), ' · ', h('a', {href: `#/jobs/${encodeURIComponent(job.job_id)}/trace`, id: 'trace-link', text: 'Trace waterfall'})),
      h('h1', {}, h('span', {class: 'mono', text: job.job_id}), ' ', h('span', {id: 'job-status', dataset: {status: job.status}}, badge(job.status))),
      meta([['request id', job.request_id], ['tenant', job.tenant], ['created', when(job.created_at)],
        ['updated', when(job.updated_at)], ['step', `${job.step + 1} of at most ${job.max_steps}`],
        ['tools', (job.tools || []).join(', ')], ['approval policy', job.require_approval ? JSON.stringify(job.require_approval) : undefined],
        ['approval deadline', job.approval_deadline_at && job.status === 'awaiting_approval' ? when(job.approval_deadline_at) : undefined]]),
      TERMINAL.has(job.status) ? null
        : h('button', {type: 'button', class: 'danger subtle', id: 'cancel', onclick: cancel, text: 'Cancel job'})));
    restBox.replaceChildren();
    add(restBox, [
      section('Outcome', outcome),
      section('Conversation', conversation(job.messages)),
      h('div', {class: 'steps'}, (job.steps || []).length ? job.steps.map(step)
        : section('Calls', h('ol', {class: 'calls'}, (job.calls || []).map(call)))),
      (job.discarded_calls || []).length ? section('Discarded calls', h('ol', {class: 'calls'}, job.discarded_calls.map(call))) : null,
      webhooks(job.webhooks)]);
  }

  async function cancel() {
    try { await api(`/v1/jobs/${encodeURIComponent(job.job_id)}/cancel`, {method: 'POST'}); } catch (error) { /* the stream shows the state */ }
  }

  let timer = null;
  let stopped = false;
  function refresh() {
    if (timer) return;
    timer = setTimeout(async () => {
      timer = null;
      try {
        job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
        if (!stopped) render();
      } catch (error) {
        if (error instanceof ApiError && error.status === 401) context.unauthorized();
      }
    }, 80);
  }

  const controller = new AbortController();
  async function follow() {
    let last = null;
    while (!stopped) {
      try {
        context.live('● live');
        last = await stream(`/v1/jobs/${encodeURIComponent(jobId)}/events?timeout_s=300`, () => refresh(), {signal: controller.signal, lastEventId: last});
      } catch (error) {
        if (stopped) return;
        if (error instanceof ApiError && error.status === 401) { context.unauthorized(); return; }
      }
      if (stopped) return;
      context.live(TERMINAL.has(job.status) ? '● ended' : '○ reconnecting');
      refresh();
      await new Promise((resolve) => setTimeout(resolve, 800));
    }
  }
  render();
  follow();
  return {dispose() { stopped = true; controller.abort(); clearTimeout(timer); }};
}
