"""Engine builds per (model, GPU, TensorRT-LLM version), manifests, and Triton model repositories.

Stages, one module each, imports flowing one way:
``gpus`` ← ``plan`` ← ``build``; ``tokenizer_info`` and ``config_check`` (which imports the wire contract from ``decider.triton_wire``) ← ``triton_repo``;
``manifest`` is shared; ``cli`` wires them into ``toolrail engine ...``.
"""
