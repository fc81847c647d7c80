// openai-node against toolrail: each check drives one surface as a user would and prints {check: {ok, detail}}.
// Run by tests/conformance/test_openai_node.py with OPENAI_BASE_URL pointing at the served app.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: "unused", maxRetries: 0, timeout: 120000 });
const NOTE_CHAT = {
  type: "function",
  function: {
    name: "save_note", description: "save a short note",
    parameters: { type: "object", properties: { title: { type: "string", maxLength: 24 }, pages: { type: "integer" } },
                  required: ["title", "pages"], additionalProperties: false },
  },
};
const NOTE = { type: "function", name: "save_note", description: "save a short note", strict: true,
               parameters: NOTE_CHAT.function.parameters };
const ASK = "Save a note titled groceries with 2 pages.";
const results = {};

async function check(name, body) {
  try {
    results[name] = { ok: true, detail: await body() };
  } catch (error) {
    results[name] = { ok: false, detail: String(error && error.stack || error) };
  }
}

function assert(condition, message) {
  if (!condition) throw new Error(message);
}

await check("chat: streamed tool calls (id, type, name in the first delta only)", async () => {
  const stream = await client.chat.completions.create({
    model: "toolrail", messages: [{ role: "user", content: ASK }], tools: [NOTE_CHAT], tool_choice: "required",
    parallel_tool_calls: false, max_tokens: 60, stream: true });
  const deltas = [];
  for await (const chunk of stream) for (const choice of chunk.choices) deltas.push(...(choice.delta.tool_calls || []));
  assert(deltas.length > 1, `one delta only: ${JSON.stringify(deltas)}`);
  assert(deltas[0].id && deltas[0].type === "function" && deltas[0].function.name === "save_note", JSON.stringify(deltas[0]));
  assert(deltas.slice(1).every((d) => d.id === undefined && d.type === undefined && !(d.function && d.function.name)),
         JSON.stringify(deltas.slice(1, 3)));
  return deltas.length;
});

await check("chat: the stream helper (chat.completions.stream)", async () => {
  const stream = client.chat.completions.stream({
    model: "toolrail", messages: [{ role: "user", content: ASK }], tools: [NOTE_CHAT], tool_choice: "required",
    parallel_tool_calls: false, max_tokens: 60 });
  const final = await stream.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  assert(call.id.startsWith("call_") && call.id.split("call_").length === 2, `joined id ${call.id}`);
  assert(call.function.name === "save_note", `joined name ${call.function.name}`);
  JSON.parse(call.function.arguments);
  return call.id;
});

await check("chat: finish_reason length and usage when max_tokens cuts the answer", async () => {
  const completion = await client.chat.completions.create({
    model: "toolrail", messages: [{ role: "user", content: "Tell a story." }], max_tokens: 5 });
  assert(completion.choices[0].finish_reason === "length", completion.choices[0].finish_reason);
  assert(completion.usage.completion_tokens === 5 && completion.usage.prompt_tokens > 0, JSON.stringify(completion.usage));
  return completion.usage;
});

await check("chat: an unknown model is a 404 model_not_found", async () => {
  try {
    await client.chat.completions.create({ model: "gpt-17-imaginary", messages: [{ role: "user", content: "hi" }] });
  } catch (error) {
    assert(error instanceof OpenAI.NotFoundError && error.code === "model_not_found" && error.param === "model",
           `${error.status} ${error.code} ${error.param}`);
    return error.status;
  }
  throw new Error("accepted");
});

await check("responses: create with a function tool, then the tool's output by previous_response_id", async () => {
  const first = await client.responses.create({ model: "toolrail", input: ASK, tools: [NOTE], tool_choice: "required",
                                                parallel_tool_calls: false, max_output_tokens: 60 });
  const call = first.output[0];
  assert(first.status === "completed" && call.type === "function_call" && call.name === "save_note", JSON.stringify(first.output));
  const second = await client.responses.create({
    model: "toolrail", previous_response_id: first.id, tool_choice: "none", tools: [NOTE], max_output_tokens: 8,
    input: [{ type: "function_call_output", call_id: call.call_id, output: "saved" }] });
  assert(second.output[0].type === "message" && second.output_text === second.output[0].content[0].text,
         JSON.stringify(second.output));
  return [first.id, second.id];
});

await check("responses: streaming events: a function call", async () => {
  const stream = client.responses.stream({ model: "toolrail", input: ASK, tools: [NOTE], tool_choice: "required",
                                           parallel_tool_calls: false, max_output_tokens: 60 });
  const kinds = [];
  const numbers = [];
  for await (const event of stream) {
    kinds.push(event.type);
    numbers.push(event.sequence_number);
  }
  const final = await stream.finalResponse();
  assert(kinds[0] === "response.created" && kinds.at(-1) === "response.completed", kinds.join(","));
  assert(kinds.includes("response.function_call_arguments.done"), kinds.join(","));
  assert(numbers.every((n, i) => n === i), numbers.join(","));
  assert(final.output[0].type === "function_call", JSON.stringify(final.output));
  return kinds.length;
});

console.log(JSON.stringify(results));
