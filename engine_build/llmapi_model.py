"""toolrail's Triton Python model serving TensorRT-LLM's LLM API (PyTorch backend) with guided decoding.

Copied into ``<repo>/llmapi/1/model.py`` by ``toolrail engine triton-repo --flavor pytorch``;
it runs inside the Triton server (``triton_python_backend_utils`` and ``tensorrt_llm`` are
imported there, never by toolrail itself). It takes the same tensors as the BLS model of the
engine layout (``decider.triton_wire.CLIENT_INPUTS``), so the decider speaks one
interface to both. An unknown guide type is an error response, never unconstrained output.
Every request streams on its own response sender; Triton puts the request id on each response.
"""

import asyncio
import json
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

#: Triton guide type → ``GuidedDecodingParams`` field.
_GUIDE_FIELDS = {"json_schema": "json", "json": "json_object", "regex": "regex", "ebnf_grammar": "grammar"}


def _scalar(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value.item() if hasattr(value, "item") else value


def _strings(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


def _response(text, finish_reason=""):
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=object)),
            pb_utils.Tensor("finish_reason", np.array([[finish_reason.encode("utf-8")]], dtype=object)),
        ]
    )


class TritonPythonModel:
    def initialize(self, args):
        from tensorrt_llm import LLM

        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        if params.get("guided_decoding_backend") != "xgrammar":
            raise pb_utils.TritonModelException("guided_decoding_backend must be 'xgrammar'")
        if not config.get("model_transaction_policy", {}).get("decoupled"):
            raise pb_utils.TritonModelException("this model streams: set model_transaction_policy { decoupled: true }")
        with open(os.path.join(args["model_repository"], params["llm_api_options"])) as handle:
            options = yaml.safe_load(handle) or {}
        options["guided_decoding_backend"] = "xgrammar"
        options.setdefault("model", params["model"])
        self.llm = LLM(**options)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def execute(self, requests):
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._serve(request, request.get_response_sender()), self.loop)
        return None

    def _sampling_params(self, request):
        from tensorrt_llm import SamplingParams
        from tensorrt_llm.llmapi import GuidedDecodingParams

        kwargs = {
            "max_tokens": int(_scalar(request, "max_tokens")),
            "temperature": float(_scalar(request, "temperature", 0.0)),
            "top_p": float(_scalar(request, "top_p", 1.0)),
            # The decider's prompt is already rendered by the chat template, BOS included: the LLM
            # API's default (add_special_tokens=True) would add a second one.
            "add_special_tokens": False,
        }
        seed = _scalar(request, "seed")
        if seed is not None:
            kwargs["seed"] = int(seed)
        stop = _strings(request, "stop_words")
        if stop:
            kwargs["stop"] = stop
        guide_type = _scalar(request, "guided_decoding_guide_type")
        if guide_type:
            field = _GUIDE_FIELDS.get(guide_type)
            if field is None:
                raise ValueError(f"unknown guided_decoding_guide_type {guide_type!r}; known: {sorted(_GUIDE_FIELDS)}")
            guide = _scalar(request, "guided_decoding_guide")
            if field != "json_object" and not guide:
                raise ValueError(f"guided_decoding_guide_type {guide_type!r} needs guided_decoding_guide")
            kwargs["guided_decoding"] = GuidedDecodingParams(**{field: True if field == "json_object" else guide})
        return SamplingParams(**kwargs)

    async def _serve(self, request, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            prompt = _scalar(request, "text_input")
            streaming = bool(_scalar(request, "stream", False))
            params = self._sampling_params(request)
            sent = ""
            finish_reason = ""
            result = self.llm.generate_async(prompt, params, streaming=streaming)
            async for output in result:
                if request.is_cancelled():
                    result.abort()
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled")), flags=final)
                    return
                completion = output.outputs[0]
                finish_reason = completion.finish_reason or ""
                if streaming and not output.finished and len(completion.text) > len(sent):
                    sender.send(_response(completion.text[len(sent):]))
                    sent = completion.text
            text = completion.text
            sender.send(_response(text[len(sent):] if streaming else text, finish_reason), flags=final)
        except Exception as exc:  # every failure reaches the client as an error response, never silence
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=final)

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.llm.shutdown()
