// A job's span tree as a waterfall (API → job → decide → chat attempts → calls → sandbox), from the trace store that
// `toolrail run --trace` reads (GET /v1/jobs/{id}/trace; spans kept with TOOLRAIL_TRACE_STORE=redis).
import {api, ApiError} from './api.js';
import {h, json} from './dom.js';

const DETAIL = ['toolrail.decision.attempt', 'gen_ai.usage.input_tokens', 'gen_ai.usage.output_tokens',
  'toolrail.job.status', 'toolrail.call.status', 'error.type'];

function ordered(spans) {
  const byId = new Map(spans.map((s) => [s.span_id, s]));
  const children = new Map();
  for (const s of spans) {
    const parent = byId.has(s.parent_span_id) ? s.parent_span_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(s);
  }
  for (const list of children.values()) list.sort((a, b) => (a.start_ns - b.start_ns) || a.name.localeCompare(b.name));
  const out = [];
  const walk = (span, depth) => {
    out.push({span, depth});
    for (const kid of children.get(span.span_id) || []) walk(kid, depth + 1);
  };
  for (const root of children.get(null) || []) walk(root, 0);
  return out;
}

function waterfall(trace) {
  const spans = trace.spans || [];
  const start = Math.min(...spans.map((s) => s.start_ns));
  const end = Math.max(...spans.map((s) => s.end_ns || s.start_ns));
  const total = Math.max(1, end - start);
  const rows = ordered(spans).map(({span, depth}) => {
    const offset = (span.start_ns - start) / total;
    const width = Math.max(0.002, ((span.end_ns || span.start_ns) - span.start_ns) / total);
    const ms = ((span.end_ns || span.start_ns) - span.start_ns) / 1e6;
    const attrs = span.attributes || {};
    const resource = span.resource || {};
    const detail = DETAIL.filter((k) => k in attrs).map((k) => `${k.split('.').pop()}=${attrs[k]}`).join(' ');
    const kind = String(resource['toolrail.process.kind'] || resource['service.name'] || 'other').replace(/\W/g, '');
    return h('li', {class: `span kind-${kind}${span.status === 'ERROR' ? ' failed' : ''}`, dataset: {name: span.name}},
      h('details', {},
        h('summary', {},
          h('span', {class: 'span-name', style: {paddingLeft: `${depth * 1.1}em`}, text: span.name}),
          h('span', {class: 'span-track'},
            h('span', {class: 'span-bar', style: {left: `${(offset * 100).toFixed(3)}%`, width: `${(Math.min(width, 1 - offset) * 100).toFixed(3)}%`},
              title: `${ms.toFixed(2)} ms`})),
          h('span', {class: 'span-ms', text: `${ms.toFixed(1)} ms`}),
          h('span', {class: 'span-proc muted', text: `${resource['service.name'] || '?'}[${resource['process.pid'] || '?'}] ${detail}`})),
        json({name: span.name, kind: span.kind, status: span.status, status_description: span.status_description,
          start_offset_ms: (span.start_ns - start) / 1e6, duration_ms: ms, attributes: attrs, events: span.events,
          resource})));
  });
  return [
    h('p', {class: 'muted', id: 'trace-summary', text: `trace ${trace.trace_id} · ${spans.length} spans · ${(total / 1e6).toFixed(1)} ms from the first span's start to the last span's end`}),
    h('div', {class: 'axis'}, h('span', {text: '0 ms'}), h('span', {text: `${(total / 2e6).toFixed(1)} ms`}), h('span', {text: `${(total / 1e6).toFixed(1)} ms`})),
    h('ol', {class: 'waterfall', id: 'waterfall'}, rows),
  ];
}

export async function traceView(root, context, jobId) {
  const path = `/v1/jobs/${encodeURIComponent(jobId)}/trace`;
  const body = h('div');
  const refresh = h('button', {type: 'button', id: 'trace-refresh', text: 'Refresh', onclick: load});
  root.replaceChildren(h('section', {class: 'card'},
    h('p', {}, h('a', {href: `#/jobs/${encodeURIComponent(jobId)}`, text: '← Job'}), ' · ', refresh),
    h('h1', {}, 'Trace of ', h('span', {class: 'mono', text: jobId})), body));
  let seen = -1;
  let stopped = false;
  async function load() {
    let trace;
    try {
      trace = await api(path);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) { context.unauthorized(); return; }
      body.replaceChildren(h('p', {class: 'error', role: 'alert', text: error instanceof ApiError ? `${error.type}: ${error.message}` : String(error)}));
      return;
    }
    const spans = trace.spans || [];
    if (!spans.length) {
      body.replaceChildren(h('p', {class: 'muted', id: 'trace-empty', text: trace.store === 'redis'
        ? 'No spans yet: they arrive in batches a moment after the work.'
        : 'This API keeps no spans: start it with TOOLRAIL_TRACE_STORE=redis (as `toolrail run --trace` does).'}));
    } else if (spans.length !== seen) {
      body.replaceChildren(...waterfall(trace));
    }
    seen = spans.length;
  }
  await load();
  let polls = 0;
  const timer = setInterval(() => { if (!stopped && ++polls <= 15) load(); }, 1000); // spans arrive in batches
  return {dispose() { stopped = true; clearInterval(timer); }};
}
