"""Tiny random-weight models of three tool-calling families, built offline in a second each.

Each family gets a tokenizer built with ``tokenizers`` — a byte-level vocabulary (every byte one
token, so any text encodes) plus the family's own special tokens with the family's ids flagged as
special or not — and the family's chat template (``native/*.jinja``, licences in
``native/LICENSES.md``), around a random-init ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` /
``MistralForCausalLM`` of a few hundred thousand parameters. The weights decide nothing: the
grammar forces every native call's syntax out of noise, which is what the tests check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FAMILIES", "Family", "build_family_model"]

TEMPLATES = Path(__file__).parent / "native"


@dataclass(frozen=True)
class Family:
    name: str
    config: str
    template: str
    #: (token, special) in id order after the 256 byte tokens.
    added: tuple[tuple[str, bool], ...]
    bos: str | None
    eos: str
    #: The tool format toolrail must detect from the template.
    tool_format: str


FAMILIES: dict[str, Family] = {
    "qwen2": Family("qwen2", "Qwen2Config", "qwen2_5.jinja",
                    (("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                     ("<tool_call>", False), ("</tool_call>", False)),
                    bos=None, eos="<|im_end|>", tool_format="hermes"),
    "llama": Family("llama", "LlamaConfig", "llama3_json.jinja",
                    (("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
                     ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<|eom_id|>", True), ("<|python_tag|>", True)),
                    bos="<|begin_of_text|>", eos="<|eot_id|>", tool_format="llama3_json"),
    "mistral": Family("mistral", "MistralConfig", "mistral_v0_3.jinja",
                      (("<unk>", True), ("<s>", True), ("</s>", True), ("[INST]", True), ("[/INST]", True),
                       ("[TOOL_CALLS]", True), ("[AVAILABLE_TOOLS]", True), ("[/AVAILABLE_TOOLS]", True),
                       ("[TOOL_RESULTS]", True), ("[/TOOL_RESULTS]", True)),
                      bos="<s>", eos="</s>", tool_format="mistral"),
}


def _tokenizer(family: Family):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: index for index, char in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_tokens([AddedToken(token, special=special, normalized=False) for token, special in family.added])
    specials = {token for token, special in family.added if special}
    core.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    template = (TEMPLATES / family.template).read_text(encoding="utf-8")
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=family.bos, eos_token=family.eos,
                                   unk_token=None, pad_token=family.eos, chat_template=template)


def build_family_model(name: str, directory: Path | str, *, hidden_size: int = 64, seed: int = 0) -> Path:
    """Write a tiny random model of family ``name`` with its tokenizer and template to ``directory``."""
    import torch
    import transformers

    family = FAMILIES[name]
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return directory
    tokenizer = _tokenizer(family)
    config = getattr(transformers, family.config)(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    (directory / "family.json").write_text(json.dumps({"family": name, "params": model.num_parameters()}) + "\n")
    return directory
