// The job API, called with the key the person typed (Authorization header). The key is kept in this tab only
// (memory and sessionStorage): never in a URL, never in a cookie.

const KEY = 'toolrail.apiKey';
let memoryKey = null;

export function getKey() {
  if (memoryKey !== null) return memoryKey;
  try { return sessionStorage.getItem(KEY); } catch { return null; }
}

export function setKey(key) {
  memoryKey = key;
  try { sessionStorage.setItem(KEY, key); } catch { /* memory only */ }
}

export function forgetKey() {
  memoryKey = null;
  try { sessionStorage.removeItem(KEY); } catch { /* nothing kept */ }
}

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.type = error.type || 'http_error';
    this.details = error.details || null;
  }
}

function headers(extra) {
  const out = {Accept: 'application/json', ...extra};
  const key = getKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

export async function api(path, {method = 'GET', body} = {}) {
  const init = {method, headers: headers(body === undefined ? {} : {'Content-Type': 'application/json'}),
    credentials: 'omit', cache: 'no-store'};
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/**
 * Server-Sent Events read with fetch (EventSource cannot send the Authorization header): calls
 * onEvent(type, data, id) for each event until the stream ends or signal aborts. Returns the last event id.
 */
export async function stream(path, onEvent, {signal, lastEventId} = {}) {
  const extra = {Accept: 'text/event-stream'};
  if (lastEventId) extra['Last-Event-ID'] = lastEventId;
  const response = await fetch(path, {headers: headers(extra), signal, credentials: 'omit', cache: 'no-store'});
  if (!response.ok) {
    let data = null;
    try { data = await response.json(); } catch { data = null; }
    throw new ApiError(response.status, data);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let last = lastEventId || null;
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return last;
    buffer += value.replace(/\r\n/g, '\n');
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let type = 'message';
      let data = '';
      for (const line of block.split('\n')) {
        if (!line || line.startsWith(':')) continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? '' : line.slice(colon + 1);
        if (text.startsWith(' ')) text = text.slice(1);
        if (field === 'event') type = text;
        else if (field === 'data') data += (data ? '\n' : '') + text;
        else if (field === 'id') last = text;
      }
      if (data) {
        let parsed = null;
        try { parsed = JSON.parse(data); } catch { continue; }
        onEvent(type, parsed, last);
      }
    }
  }
}

let toolsCache = null;
/** The tools this tenant may call, by name (their JSON Schemas: what an edit is checked against). */
export async function tools() {
  if (!toolsCache) {
    toolsCache = api('/v1/tools').then((body) => new Map(body.tools.map((t) => [t.name, t])))
      .catch((error) => { toolsCache = null; throw error; });
  }
  return toolsCache;
}
