// The console's router: #/jobs, #/jobs/<id>, #/jobs/<id>/trace, #/ops. Asks for an API key when the API wants one.
import {ApiError, forgetKey, getKey, setKey} from './api.js';
import {h} from './dom.js';
import {jobView} from './job.js';
import {jobsView} from './jobs.js';
import {opsView} from './ops.js';
import {traceView} from './trace.js';

const main = document.getElementById('main');
const forget = document.getElementById('forget-key');
let current = null;

const context = {
  unauthorized: () => askKey(),
  live(text) { document.getElementById('live').textContent = text; },
};

function askKey(message) {
  dispose();
  const input = h('input', {id: 'api-key', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true});
  const form = h('form', {class: 'card key-form', onsubmit: (event) => {
    event.preventDefault();
    if (!input.value) return;
    setKey(input.value.trim());
    input.value = '';
    route();
  }},
  h('h1', {text: 'API key'}),
  h('p', {text: message || 'This API has API keys: type yours. It is kept in this tab only and sent in the Authorization header.'}),
  h('label', {for: 'api-key', text: 'Key'}), input,
  h('button', {type: 'submit', class: 'primary', text: 'Use key'}));
  main.replaceChildren(form);
  input.focus();
}

function dispose() {
  if (current && current.dispose) current.dispose();
  current = null;
  context.live('');
}

async function route() {
  dispose();
  forget.hidden = !getKey();
  const hash = location.hash || '#/jobs';
  const parts = hash.slice(2).split('/').map(decodeURIComponent);
  main.replaceChildren(h('p', {text: 'Loading…'}));
  try {
    if (parts[0] === 'jobs' && parts[1] && parts[2] === 'trace') current = await traceView(main, context, parts[1]);
    else if (parts[0] === 'jobs' && parts[1]) current = await jobView(main, context, parts[1]);
    else if (parts[0] === 'ops') current = await opsView(main, context);
    else current = await jobsView(main, context);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      askKey(getKey() ? 'That key was refused: type a valid one.' : undefined);
      return;
    }
    const text = error instanceof ApiError ? `${error.type}: ${error.message}` : String(error);
    main.replaceChildren(h('section', {class: 'card error', role: 'alert'}, h('h1', {text: 'Could not load'}), h('p', {text})));
  }
}

forget.addEventListener('click', () => { forgetKey(); route(); });
window.addEventListener('hashchange', route);
route();
