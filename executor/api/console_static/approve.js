// A person's decisions: approve (maybe with edited arguments), reject with a reason, review a needs_review job.
// Edited arguments are checked against the tool's JSON Schema before anything is sent.
import {api, ApiError} from './api.js';
import {h, json, toast} from './dom.js';
import {checkArguments, validate} from './schema.js';

const WHY = {
  job: 'the job asked for approval of this tool (require_approval)',
  tool: 'the tool is marked as needing approval',
  tenant: "this tenant's policy requires approval",
  provenance: 'a value came from a tool output the platform does not trust',
};

function errorList(errors) {
  return errors.map((e) => h('li', {}, h('code', {text: e.path}), ' ', e.message));
}

function refusal(error) {
  if (!(error instanceof ApiError)) return String(error);
  const details = error.details && error.details.errors
    ? ' — ' + error.details.errors.map((e) => `${e.path || ''} ${e.message || ''}`.trim()).join('; ') : '';
  return `${error.type}: ${error.message}${details}`;
}

export function provenanceTable(approval) {
  if (!approval.provenance || !approval.provenance.length) return null;
  return h('table', {class: 'provenance'},
    h('caption', {text: 'Where each value came from'}),
    h('thead', {}, h('tr', {}, ['Field', 'Value', 'Source', 'Trusted'].map((t) => h('th', {scope: 'col', text: t})))),
    h('tbody', {}, approval.provenance.map((entry) => h('tr', {class: entry.trusted ? '' : 'untrusted'},
      h('td', {}, h('code', {text: entry.path})),
      h('td', {class: 'mono', text: JSON.stringify(entry.value)}),
      h('td', {text: (entry.sources || []).map((s) => (s.kind === 'tool' ? `tool ${s.tool}${s.mcp ? ' (MCP)' : ''}` : s.kind)).join(', ') || 'not found in the conversation'}),
      h('td', {text: entry.trusted ? 'yes' : 'NO'})))));
}

/** The card of one call waiting for approval; stays the same element while the call waits (edits survive updates). */
export function approvalCard(job, call, tool) {
  const id = call.id.replace(/[^\w-]/g, '_');
  const original = JSON.stringify(call.arguments || {}, null, 2);
  const editor = h('textarea', {id: `args-${id}`, class: 'args', rows: Math.min(16, original.split('\n').length + 1),
    spellcheck: 'false', 'aria-describedby': `errors-${id}`});
  editor.value = original;
  const errors = h('ul', {id: `errors-${id}`, class: 'errors', role: 'alert'});
  const reason = h('input', {id: `reason-${id}`, type: 'text', maxlength: 500, placeholder: 'the model sees it as the call\'s result'});
  const approve = h('button', {type: 'button', class: 'primary approve', text: 'Approve'});
  const reject = h('button', {type: 'button', class: 'danger reject', text: 'Reject'});
  const reset = h('button', {type: 'button', class: 'reset', text: 'Undo edits'});

  function check() {
    const result = checkArguments(editor.value, tool);
    errors.replaceChildren(...errorList(result.errors));
    approve.disabled = result.errors.length > 0;
    approve.textContent = editor.value.trim() === original.trim() || JSON.stringify(result.value) === JSON.stringify(call.arguments)
      ? 'Approve' : 'Approve edited';
    return result;
  }

  async function decide(decision) {
    let body = {};
    if (decision === 'approve') {
      const result = check();
      if (result.errors.length) { editor.focus(); return; }
      if (JSON.stringify(result.value) !== JSON.stringify(call.arguments)) body = {arguments: result.value};
    } else if (reason.value.trim()) {
      body = {reason: reason.value.trim()};
    }
    approve.disabled = reject.disabled = true;
    try {
      await api(`/v1/jobs/${encodeURIComponent(job.job_id)}/calls/${encodeURIComponent(call.id)}/${decision}`, {method: 'POST', body});
      toast(decision === 'approve' ? `approved ${call.name}` : `rejected ${call.name}`);
      card.dataset.decided = decision;
    } catch (error) {
      errors.replaceChildren(h('li', {text: refusal(error)}));
      approve.disabled = reject.disabled = false;
    }
  }

  editor.addEventListener('input', check);
  approve.addEventListener('click', () => decide('approve'));
  reject.addEventListener('click', () => decide('reject'));
  reset.addEventListener('click', () => { editor.value = original; check(); editor.focus(); });
  const approval = call.approval || {};
  const card = h('section', {class: 'card approval', dataset: {callId: call.id}, 'aria-labelledby': `title-${id}`},
    h('h2', {id: `title-${id}`, text: `${call.name} waits for your approval`}),
    h('p', {}, 'Why: ', h('strong', {text: WHY[approval.required_by] || String(approval.required_by || 'policy')}),
      approval.untrusted && approval.untrusted.length ? ` — untrusted: ${approval.untrusted.join(', ')}` : ''),
    job.approval_deadline_at ? h('p', {class: 'muted', text: `Decide before ${new Date(job.approval_deadline_at * 1000).toLocaleString()}, or the job expires.`}) : null,
    provenanceTable(approval),
    h('label', {for: editor.id, text: `Arguments of ${call.name} (JSON; checked against the tool's schema)`}), editor, errors,
    h('div', {class: 'actions'}, approve, reset),
    h('label', {for: reason.id, text: 'Reason for a rejection'}), reason,
    h('div', {class: 'actions'}, reject));
  check();
  return card;
}

/** The calls a needs_review job's last attempt proposed, as [{name, arguments}], for the reviewer to edit. */
function proposed(job) {
  const steps = job.steps || [];
  const step = steps[steps.length - 1] || {};
  const attempts = step.attempts || job.attempts || [];
  const last = attempts[attempts.length - 1];
  if (!last || typeof last.raw_output !== 'string') return [];
  let value;
  try { value = JSON.parse(last.raw_output); } catch { return []; }
  const list = Array.isArray(value) ? value : value && value.tool_calls ? value.tool_calls : [value];
  return list.filter((c) => c && typeof c === 'object').map((c) => {
    const fn = c.function || c;
    let args = fn.arguments;
    if (typeof args === 'string') { try { args = JSON.parse(args); } catch { args = {}; } }
    return {name: String(fn.name || ''), arguments: args && typeof args === 'object' ? args : {}};
  });
}

export function reviewPanel(job, tools) {
  const findings = [];
  for (const e of ((job.error || {}).details || {}).errors || []) findings.push(e);
  const steps = job.steps || [];
  const step = steps[steps.length - 1] || {};
  for (const a of step.attempts || []) for (const f of a.findings || []) findings.push(f);
  const calls = h('textarea', {id: 'review-calls', class: 'args', rows: 10, spellcheck: 'false', 'aria-describedby': 'review-errors'});
  calls.value = JSON.stringify(proposed(job), null, 2);
  const errors = h('ul', {id: 'review-errors', class: 'errors', role: 'alert'});
  const run = h('button', {type: 'button', class: 'primary', id: 'review-run', text: 'Run these calls'});
  const answer = h('textarea', {id: 'review-answer', rows: 3});
  const answerButton = h('button', {type: 'button', id: 'review-answer-send', text: 'Answer in text'});
  const reason = h('input', {id: 'review-reason', type: 'text', maxlength: 500, placeholder: 'what the model should know'});
  const reject = h('button', {type: 'button', class: 'danger', id: 'review-reject', text: 'Reject the proposal'});

  function checkCalls() {
    let value;
    try { value = JSON.parse(calls.value); } catch (error) {
      errors.replaceChildren(h('li', {text: `not JSON: ${error.message}`}));
      run.disabled = true;
      return null;
    }
    const problems = [];
    if (!Array.isArray(value) || !value.length) problems.push({path: '/', message: 'give a list of {name, arguments}'});
    else {
      value.forEach((c, i) => {
        const tool = c && tools.get(c.name);
        if (!c || typeof c !== 'object' || !tool || !(job.tools || []).includes(c.name)) {
          problems.push({path: `/${i}/name`, message: `not a tool of this job (${(job.tools || []).join(', ')})`});
          return;
        }
        for (const e of validate(c.arguments || {}, tool.parameters || {})) problems.push({path: `/${i}/arguments${e.path === '/' ? '' : e.path}`, message: e.message});
      });
    }
    errors.replaceChildren(...errorList(problems));
    run.disabled = problems.length > 0;
    return problems.length ? null : value.map((c) => ({name: c.name, arguments: c.arguments || {}}));
  }

  async function send(body, label) {
    for (const b of [run, answerButton, reject]) b.disabled = true;
    try {
      await api(`/v1/jobs/${encodeURIComponent(job.job_id)}/review`, {method: 'POST', body});
      toast(label);
      panel.dataset.decided = label;
    } catch (error) {
      errors.replaceChildren(h('li', {text: refusal(error)}));
      answerButton.disabled = reject.disabled = false;
      checkCalls();
    }
  }

  calls.addEventListener('input', checkCalls);
  run.addEventListener('click', () => { const value = checkCalls(); if (value) send({calls: value}, 'reviewed calls sent'); });
  answerButton.addEventListener('click', () => { if (answer.value.trim()) send({answer: answer.value}, 'answered'); else answer.focus(); });
  reject.addEventListener('click', () => { if (reason.value.trim()) send({reject: reason.value.trim()}, 'rejected'); else reason.focus(); });
  const panel = h('section', {class: 'card review', id: 'review'},
    h('h2', {text: 'This job needs your review'}),
    findings.length ? h('ul', {class: 'findings'}, findings.map((f) => h('li', {},
      f.tool ? h('strong', {text: `${f.tool} `}) : null, h('code', {text: f.path || '/'}), ' ', String(f.message || JSON.stringify(f))))) : null,
    h('label', {for: calls.id, text: 'Calls to run instead (JSON list of {name, arguments}; checked against each tool\'s schema)'}),
    calls, errors, h('div', {class: 'actions'}, run),
    h('label', {for: answer.id, text: 'Or end the job with a text answer'}), answer, h('div', {class: 'actions'}, answerButton),
    h('label', {for: reason.id, text: 'Or reject the proposal (the model decides again, with your reason)'}), reason,
    h('div', {class: 'actions'}, reject));
  checkCalls();
  return panel;
}
