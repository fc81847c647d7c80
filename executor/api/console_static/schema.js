// A JSON Schema check of edited arguments before they are sent: the keywords tool schemas use (type, enum, const,
// required, properties, additionalProperties, bounds, lengths, pattern, items, anyOf/oneOf/allOf, local $ref).
// The API checks again on receipt; this is so a person sees the mistake at the field, before sending.

const TYPES = {
  string: (v) => typeof v === 'string',
  number: (v) => typeof v === 'number' && Number.isFinite(v),
  integer: (v) => Number.isInteger(v),
  boolean: (v) => typeof v === 'boolean',
  object: (v) => v !== null && typeof v === 'object' && !Array.isArray(v),
  array: (v) => Array.isArray(v),
  null: (v) => v === null,
};

function resolve(schema, root) {
  let current = schema;
  for (let hops = 0; current && typeof current.$ref === 'string' && hops < 32; hops++) {
    if (!current.$ref.startsWith('#/')) return {};
    current = current.$ref.slice(2).split('/').reduce((node, part) => (node ? node[part.replace(/~1/g, '/').replace(/~0/g, '~')] : undefined), root);
  }
  return current || {};
}

function equal(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

export function validate(value, schema, root = schema, path = '', errors = []) {
  if (schema === true || schema === undefined) return errors;
  if (schema === false) { errors.push({path: path || '/', message: 'no value is allowed here'}); return errors; }
  const s = resolve(schema, root);
  const at = path || '/';
  if (s.type !== undefined) {
    const types = [].concat(s.type);
    if (!types.some((t) => TYPES[t] && TYPES[t](value))) {
      errors.push({path: at, message: `must be ${types.join(' or ')}`});
      return errors;
    }
  }
  if (s.enum && !s.enum.some((option) => equal(option, value))) {
    errors.push({path: at, message: `must be one of ${s.enum.map((o) => JSON.stringify(o)).join(', ')}`});
  }
  if ('const' in s && !equal(s.const, value)) errors.push({path: at, message: `must be ${JSON.stringify(s.const)}`});
  if (typeof value === 'number') {
    if (s.minimum !== undefined && value < s.minimum) errors.push({path: at, message: `must be ≥ ${s.minimum}`});
    if (s.maximum !== undefined && value > s.maximum) errors.push({path: at, message: `must be ≤ ${s.maximum}`});
    if (typeof s.exclusiveMinimum === 'number' && value <= s.exclusiveMinimum) errors.push({path: at, message: `must be > ${s.exclusiveMinimum}`});
    if (typeof s.exclusiveMaximum === 'number' && value >= s.exclusiveMaximum) errors.push({path: at, message: `must be < ${s.exclusiveMaximum}`});
    if (s.multipleOf && Math.abs(value / s.multipleOf - Math.round(value / s.multipleOf)) > 1e-9) errors.push({path: at, message: `must be a multiple of ${s.multipleOf}`});
  }
  if (typeof value === 'string') {
    const length = [...value].length;
    if (s.minLength !== undefined && length < s.minLength) errors.push({path: at, message: `must have at least ${s.minLength} character(s)`});
    if (s.maxLength !== undefined && length > s.maxLength) errors.push({path: at, message: `must have at most ${s.maxLength} characters`});
    if (typeof s.pattern === 'string') {
      let pattern = null;
      try { pattern = new RegExp(s.pattern, 'u'); } catch { pattern = null; } // the API's RE2 has the last word
      if (pattern && !pattern.test(value)) errors.push({path: at, message: `must match ${s.pattern}`});
    }
  }
  if (TYPES.object(value)) {
    for (const name of s.required || []) {
      if (!(name in value)) errors.push({path: `${path}/${name}`, message: 'is required'});
    }
    const properties = s.properties || {};
    for (const [name, item] of Object.entries(value)) {
      if (name in properties) validate(item, properties[name], root, `${path}/${name}`, errors);
      else if (s.additionalProperties === false) errors.push({path: `${path}/${name}`, message: 'is not a field of this tool'});
      else if (s.additionalProperties && typeof s.additionalProperties === 'object') validate(item, s.additionalProperties, root, `${path}/${name}`, errors);
    }
  }
  if (Array.isArray(value)) {
    if (s.minItems !== undefined && value.length < s.minItems) errors.push({path: at, message: `must have at least ${s.minItems} item(s)`});
    if (s.maxItems !== undefined && value.length > s.maxItems) errors.push({path: at, message: `must have at most ${s.maxItems} items`});
    if (s.items && typeof s.items === 'object') value.forEach((item, i) => validate(item, s.items, root, `${path}/${i}`, errors));
  }
  for (const part of s.allOf || []) validate(value, part, root, path, errors);
  for (const key of ['anyOf', 'oneOf']) {
    if (Array.isArray(s[key])) {
      const fits = s[key].filter((part) => validate(value, part, root, path, []).length === 0).length;
      if (key === 'anyOf' ? fits === 0 : fits !== 1) errors.push({path: at, message: `must match ${key === 'anyOf' ? 'one of' : 'exactly one of'} the allowed shapes`});
    }
  }
  return errors;
}

/** Parse and check one call's arguments (text typed by a person): {value, errors}. */
export function checkArguments(text, tool) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return {value: undefined, errors: [{path: '/', message: `not JSON: ${error.message}`}]};
  }
  if (!TYPES.object(value)) return {value, errors: [{path: '/', message: 'arguments must be a JSON object'}]};
  if (!tool) return {value, errors: [{path: '/', message: 'unknown tool: its schema is not available'}]};
  return {value, errors: validate(value, tool.parameters || {})};
}
