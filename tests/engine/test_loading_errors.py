"""Bad checkpoints and names fail with a message that names what is wrong."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_engine.loading import CheckpointError, UnknownModelError, known_names, load_model
from tiny_checkpoints import FAMILY_SPECS, UNSUPPORTED_QUANT_VARIANT, write_hf_checkpoint, write_tiny_llama_gguf


@pytest.fixture
def llama_copy(tmp_path, tiny_llama_dir):
    """A private copy of the tiny llama checkpoint, free to break."""
    directory = tmp_path / "broken-llama"
    shutil.copytree(tiny_llama_dir, directory)
    return directory


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownModelError) as error:
        load_model("smollm3-no-such-model")
    message = str(error.value)
    assert "smollm3-no-such-model" in message
    assert known_names() and all(name in message for name in known_names())


def test_cli_reports_an_unknown_name_without_a_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dllm_engine.cli", "generate", "--model", "no-such-model",
                             "--mode", "autoregressive", "--raw", "--json", "hi"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    assert "no-such-model" in result.stderr and "smollm2-135m" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_json_is_named(llama_copy):
    (llama_copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(llama_copy))


def test_missing_weights_are_named(llama_copy):
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors weights"):
        load_model(str(llama_copy))


def test_missing_tokenizer_is_named(llama_copy):
    (llama_copy / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_model(str(llama_copy))


def test_missing_shard_is_named(tmp_path, tiny_tokenizer):
    write_hf_checkpoint(tmp_path, FAMILY_SPECS["qwen2"], tiny_tokenizer, shards=3)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError) as error:
        load_model(str(tmp_path))
    assert "model-00002-of-00003.safetensors" in str(error.value)
    assert "model-00001-of-00003.safetensors" not in str(error.value)


def test_shape_mismatch_names_tensor_and_both_shapes(llama_copy):
    weights = load_file(str(llama_copy / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"] = torch.zeros(64, 80)  # config says 96 wide
    save_file(weights, str(llama_copy / "model.safetensors"))
    with pytest.raises(CheckpointError) as error:
        load_model(str(llama_copy))
    message = str(error.value)
    assert "layer 1" in message and "down" in message
    assert "(64, 80)" in message and "(64, 96)" in message


def test_missing_tensor_is_named(llama_copy):
    weights = load_file(str(llama_copy / "model.safetensors"))
    del weights["model.layers.0.self_attn.k_proj.weight"]
    save_file(weights, str(llama_copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor layer 0 k \(expected shape \(32, 64\)\)"):
        load_model(str(llama_copy))


def test_unsupported_model_type_lists_the_supported_ones(llama_copy):
    config = json.loads((llama_copy / "config.json").read_text())
    config.update(model_type="mamba", architectures=["MambaForCausalLM"])
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        load_model(str(llama_copy))
    assert "mamba" in str(error.value) and "llama" in str(error.value) and "qwen3" in str(error.value)


def test_config_without_a_shape_key_names_it(llama_copy):
    config = json.loads((llama_copy / "config.json").read_text())
    del config["hidden_size"]
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_size"):
        load_model(str(llama_copy))


def test_unsupported_gguf_quant_type_is_named(tmp_path, tiny_tokenizer):
    path = tmp_path / "tiny-iq4.gguf"
    write_tiny_llama_gguf(path, tiny_tokenizer, UNSUPPORTED_QUANT_VARIANT)
    with pytest.raises(CheckpointError) as error:
        load_model(str(path))
    message = str(error.value)
    assert "IQ4_NL" in message and "ffn_down" in message and path.name in message
    assert "Q4_1" in message and "Q8_0" in message  # says what is supported


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here.gguf"):
        load_model(str(tmp_path / "nothing-here.gguf"))


def test_tensors_the_config_has_no_place_for_are_named(llama_copy):
    """Weights the model would silently drop (a third layer where config.json says two)
    mean config and checkpoint disagree: refuse, naming them."""
    weights = load_file(str(llama_copy / "model.safetensors"))
    for name in [n for n in weights if n.startswith("model.layers.1.")]:
        weights[name.replace("layers.1.", "layers.2.")] = weights[name].clone()
    save_file(weights, str(llama_copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no place for.*layer 2"):
        load_model(str(llama_copy))


def test_qkv_biases_in_a_family_without_them_are_named(llama_copy):
    weights = load_file(str(llama_copy / "model.safetensors"))
    weights["model.layers.0.self_attn.q_proj.bias"] = torch.ones(64)
    save_file(weights, str(llama_copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no place for.*layer 0 q_bias"):
        load_model(str(llama_copy))


def test_an_adapter_decodes_with_its_decode_block_size_when_it_names_one(tmp_path, make_tiny_bd, tiny_llama_dir):
    from dllm_engine.loading.registry import attach_adapter
    from dllm_engine.training.trainer import TrainConfig, export_adapter

    trained = make_tiny_bd(seed=0)
    path = tmp_path / "tiny-bd.safetensors"
    export_adapter(trained, TrainConfig(block_size=4, rank=4, alpha=8.0), path, {})
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())

    as_trained = load_model(str(tiny_llama_dir), dtype=torch.float32)
    attach_adapter(as_trained, path)
    assert as_trained.config.block_size == 4

    meta_path.write_text(json.dumps({**meta, "decode_block_size": 2}))
    smaller = load_model(str(tiny_llama_dir), dtype=torch.float32)
    attach_adapter(smaller, path)
    assert smaller.config.block_size == 2
    lora = {n: p for n, p in smaller.model.named_parameters() if "lora" in n}
    assert lora and all(torch.equal(p, dict(as_trained.model.named_parameters())[n]) for n, p in lora.items())
