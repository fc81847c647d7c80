// Every value reaches the page as text. Elements are built here; their text goes in with text nodes (textContent),
// never innerHTML; links point only at the console's own routes (#/...), so no value can become a script or a URL.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = String(value);
    else if (key === 'href') el.setAttribute('href', route(value));
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'style') Object.assign(el.style, value); // CSSOM, allowed by the CSP (no style attribute)
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value') el.value = String(value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  add(el, children);
  return el;
}

export function add(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** A console route (``#/...``); anything else becomes the jobs list. */
export function route(value) {
  const text = String(value);
  return /^#\/[\w\-/.]*$/.test(text) ? text : '#/jobs';
}

/** A JSON value, pretty-printed, as text. */
export function json(value, cls = 'json') {
  return h('pre', {class: cls, text: value === undefined ? '' : JSON.stringify(value, null, 2)});
}

export function badge(status) {
  return h('span', {class: `badge status-${String(status).replace(/[^a-z_]/g, '')}`, text: String(status)});
}

export function when(epochSeconds) {
  if (!epochSeconds) return '–';
  return new Date(epochSeconds * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function age(epochSeconds) {
  if (!epochSeconds) return '–';
  const s = Math.max(0, Date.now() / 1000 - epochSeconds);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function section(title, ...children) {
  return h('section', {class: 'card'}, h('h2', {text: title}), ...children);
}

let toastTimer = null;
export function toast(message, kind = 'info') {
  const el = document.getElementById('toast');
  el.textContent = String(message);
  el.className = `toast show ${kind}`;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.className = 'toast'; }, 4000);
}

export const TERMINAL = new Set(['succeeded', 'failed', 'needs_review', 'cancelled', 'expired']);
