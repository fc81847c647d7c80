"""Engine builds per (model, GPU, TensorRT-LLM version), manifests, and Triton model repositories.

Stages, one module each, imports flowing one way:
``gpus`` ← ``sizing`` ← ``plan`` ← ``build``; ``tokenizer_info`` and ``config_check`` (which imports the wire contract from ``decider.triton_wire``) ← ``triton_repo``;
``plan``, ``sizing`` and ``config_check`` ← ``publish``; ``manifest`` is shared; ``cli`` wires them into ``toolrail engine ...``.
``s3_double`` is a local S3 (moto, one region) for the tests and ``scripts/gpu_check.sh``.
"""
