"""The `-hf` resolver against llama.cpp's rules (common/download.cpp find_best_model,
get_gguf_split_info, gguf_filename_is_model, get_split_files; common_download_split_repo_tag;
hf-cache.cpp is_valid_repo_id) on listings of real repos' file names (tests/data/hf_listings.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf.hub import is_remote, names, parse_ref
from moeconf.hub.ref import RemoteRef

BART = "zai-org_GLM-4.5-Air"
LISTINGS: dict[str, list[str]] = json.loads(
    (Path(__file__).parent / "data" / "hf_listings.json").read_text())["repos"]


@pytest.mark.parametrize(("repo", "tag", "want"), [
    ("unsloth/GLM-4.5-Air-GGUF", "Q4_K_M", "Q4_K_M/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf"),
    ("unsloth/GLM-4.5-Air-GGUF", "", "Q4_K_M/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf"),  # default tag Q4_K_M
    ("unsloth/GLM-4.5-Air-GGUF", "q4_k_xl", "UD-Q4_K_XL/GLM-4.5-Air-UD-Q4_K_XL-00001-of-00002.gguf"),
    ("unsloth/GLM-4.5-Air-GGUF", "UD-Q2_K_XL", "GLM-4.5-Air-UD-Q2_K_XL.gguf"),
    # Q2_K matches 'Q2_K[.-]': GLM-4.5-Air-Q2_K.gguf; Q2_K_L is another file
    ("unsloth/GLM-4.5-Air-GGUF", "Q2_K", "GLM-4.5-Air-Q2_K.gguf"),
    ("unsloth/GLM-4.5-Air-GGUF", "bf16", "BF16/GLM-4.5-Air-BF16-00001-of-00005.gguf"),
    # the tag is searched, not anchored: 'F16[.-]' matches ...-BF16.gguf (mmproj-F16.gguf is no model)
    ("unsloth/gemma-3-27b-it-GGUF", "F16", "gemma-3-27b-it-BF16.gguf"),
    ("unsloth/gemma-3-27b-it-GGUF", "F32", None),  # only mmproj-F32.gguf matches, and it is no model
    ("bartowski/zai-org_GLM-4.5-Air-GGUF", "", f"{BART}-Q4_K_M/{BART}-Q4_K_M-00001-of-00002.gguf"),
    ("bartowski/zai-org_GLM-4.5-Air-GGUF", "Q4_K_L", f"{BART}-Q4_K_L/{BART}-Q4_K_L-00001-of-00002.gguf"),
    ("bartowski/zai-org_GLM-4.5-Air-GGUF", "BF16", f"{BART}-bf16/{BART}-bf16-00001-of-00005.gguf"),
    # no Q4_K_M and no Q8_0: the first model file (shard 1)
    ("ggml-org/gpt-oss-120b-GGUF", "", "gpt-oss-120b-mxfp4-00001-of-00003.gguf"),
    ("ggml-org/gpt-oss-120b-GGUF", "MXFP4", "gpt-oss-120b-mxfp4-00001-of-00003.gguf"),
    ("ggml-org/gpt-oss-120b-GGUF", "Q4_K_M", None),  # a tag given: no fallback
    ("ggml-org/gemma-3-4b-it-GGUF", "", "gemma-3-4b-it-Q4_K_M.gguf"),
    ("ggml-org/gemma-3-4b-it-GGUF", "F16", "gemma-3-4b-it-f16.gguf"),
    ("ggml-org/Qwen3-30B-A3B-Instruct-2507-Q8_0-GGUF", "", "qwen3-30b-a3b-instruct-2507-q8_0.gguf"),  # via Q8_0
    ("unsloth/DeepSeek-V3-0324-GGUF", "", "Q4_K_M/DeepSeek-V3-0324-Q4_K_M-00001-of-00009.gguf"),
    ("unsloth/DeepSeek-V3-0324-GGUF", "UD-IQ1_S", "UD-IQ1_S/DeepSeek-V3-0324-UD-IQ1_S-00001-of-00004.gguf"),
])
def test_find_best_model_on_real_listings(repo: str, tag: str, want: str | None) -> None:
    assert names.find_best_model(LISTINGS[repo], tag) == want


def test_only_shard_1_is_chosen_whatever_the_listing_order() -> None:
    files = ["M-Q4_K_M-00002-of-00002.gguf", "M-Q4_K_M-00001-of-00002.gguf"]
    assert names.find_best_model(files, "Q4_K_M") == "M-Q4_K_M-00001-of-00002.gguf"
    assert names.split_files(files, "M-Q4_K_M-00001-of-00002.gguf") == [
        "M-Q4_K_M-00001-of-00002.gguf", "M-Q4_K_M-00002-of-00002.gguf"]


def test_sidecars_are_never_models() -> None:
    for f in ("mmproj-F16.gguf", "x/imatrix_unsloth.gguf", "m-mtp-Q8_0.gguf", "eagle3-x.gguf", "dflash-a.gguf",
              "dspark-b.gguf", "model.bin", "README.md"):
        assert not names.is_model_file(f), f
    # the words count in the file name only (a folder may hold them)
    assert names.is_model_file("mmproj-folder/M-Q4_K_M.gguf")
    assert names.find_best_model(["imatrix-Q4_K_M.gguf", "M-Q4_K_M.gguf"], "") == "M-Q4_K_M.gguf"


def test_split_files_group_by_prefix_and_count() -> None:
    files = LISTINGS["unsloth/GLM-4.5-Air-GGUF"]
    got = names.split_files(files, "Q8_0/GLM-4.5-Air-Q8_0-00001-of-00003.gguf")
    assert got == [f"Q8_0/GLM-4.5-Air-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    # a shard of another count with the same prefix is another model
    assert names.split_files(["A-Q4_0-00001-of-00002.gguf", "A-Q4_0-00002-of-00002.gguf",
                              "A-Q4_0-00001-of-00003.gguf"], "A-Q4_0-00001-of-00002.gguf") == [
        "A-Q4_0-00001-of-00002.gguf", "A-Q4_0-00002-of-00002.gguf"]


@pytest.mark.parametrize(("repo", "count"), [
    ("unsloth/GLM-4.5-Air-GGUF", 22), ("bartowski/zai-org_GLM-4.5-Air-GGUF", 16),
    ("ggml-org/gpt-oss-120b-GGUF", 1), ("unsloth/gemma-3-27b-it-GGUF", 6), ("unsloth/DeepSeek-V3-0324-GGUF", 7)])
def test_quants_group_every_model_once(repo: str, count: int) -> None:
    files = LISTINGS[repo]
    qs = names.quants(files)
    assert len(qs) == count
    listed_models = {f for f in files if names.is_model_file(f)}
    assert {f for q in qs for f in q.files} == listed_models  # every model file in exactly one quant
    assert len({q.tag for q in qs}) == count  # labels tell them apart


@pytest.mark.parametrize("repo", sorted(LISTINGS))
def test_each_quant_has_a_tag_or_a_file_that_picks_it(repo: str) -> None:
    """The command printed for a quant (-hf REPO:TAG, else --hf-file) loads exactly that quant."""
    files = LISTINGS[repo]
    for q in names.quants(files):
        tag = names.selector_tag(files, q.primary)
        if tag is not None:
            assert names.find_best_model(files, tag) == q.primary, (tag, q.primary)
        assert q.primary in files


def test_quant_labels_are_the_uploaders_words() -> None:
    labels = [q.tag for q in names.quants(LISTINGS["unsloth/GLM-4.5-Air-GGUF"])]
    assert "UD-Q4_K_XL" in labels and "Q4_K_M" in labels and "BF16" in labels
    # UD-Q4_K_XL needs its UD- to be told from nothing else here: Q4_K_XL alone already picks it
    assert names.selector_tag(LISTINGS["unsloth/GLM-4.5-Air-GGUF"],
                              "UD-Q4_K_XL/GLM-4.5-Air-UD-Q4_K_XL-00001-of-00002.gguf") == "Q4_K_XL"


def test_repo_tags_for_messages() -> None:
    tags = names.repo_tags(LISTINGS["ggml-org/gemma-3-4b-it-GGUF"])
    assert tags == ["Q4_K_M", "F16"]


def test_split_repo_tag_as_llama_cpp() -> None:
    assert names.split_repo_tag("a/b:Q4_K_M") == ("a/b", "Q4_K_M")
    assert names.split_repo_tag("a/b") == ("a/b", "")
    assert names.split_repo_tag("a/b:x:y") == ("a/b", "y")  # the last part is the tag
    with pytest.raises(ValueError, match="expected <user>/<model>"):
        names.split_repo_tag("a/b/c:Q4_K_M")


@pytest.mark.parametrize(("repo", "ok"), [
    ("unsloth/GLM-4.5-Air-GGUF", True), ("a/b", True), ("a_b/c.d-e", True),
    ("a//b", False), ("a/b/c", False), ("-a/b", False), ("a/b-", False), ("a.-b/c", False), ("ab", False),
    ("a/b c", False), ("a/" + "x" * 255, False)])
def test_repo_ids_as_hf_cache_validates_them(repo: str, ok: bool) -> None:
    assert names.is_valid_repo_id(repo) is ok


def test_model_strings() -> None:
    assert parse_ref("unsloth/GLM-4.5-Air-GGUF:Q4_K_M") == RemoteRef(repo="unsloth/GLM-4.5-Air-GGUF", tag="Q4_K_M")
    assert parse_ref("hf://o/r/Q8_0/m-Q8_0-00002-of-00003.gguf").file == "Q8_0/m-Q8_0-00002-of-00003.gguf"
    assert parse_ref("https://h/x/m.gguf").url == "https://h/x/m.gguf"
    assert parse_ref("o/r:Q4_K_M").engine_args() == ["-hf", "o/r:Q4_K_M"]
    assert parse_ref("hf://o/r/d/m.gguf").engine_args() == ["-hf", "o/r", "--hf-file", "d/m.gguf"]
    assert parse_ref("https://h/m.gguf").engine_args() == ["-mu", "https://h/m.gguf"]
    for local in ("model.gguf", "models/x.manifest.json", "./a/b", "/abs/x", "examples"):
        assert not is_remote(local), local
    for remote in ("o/r", "o/r:Q4_K_M", "hf://o/r/m.gguf", "http://127.0.0.1/m.gguf"):
        assert is_remote(remote), remote


def test_mmproj_sibling_as_find_best_sibling() -> None:
    files = LISTINGS["unsloth/gemma-3-27b-it-GGUF"]
    # at the same depth the bits closest to the model's (BF16 and F16 tie at 16: the first listed)
    assert names.find_mmproj(files, "gemma-3-27b-it-Q4_K_M.gguf") == "mmproj-BF16.gguf"
    assert names.find_mmproj(LISTINGS["ggml-org/gemma-3-4b-it-GGUF"], "gemma-3-4b-it-Q4_K_M.gguf") == (
        "mmproj-model-f16.gguf")
    # a folder deeper than the model's is not its sibling; one above it is
    assert names.find_mmproj(["Q4/m-Q4_K_M.gguf", "other/mmproj-F16.gguf"], "Q4/m-Q4_K_M.gguf") is None
    assert names.find_mmproj(["Q4/m-Q4_K_M.gguf", "mmproj-F16.gguf", "Q4/mmproj-F32.gguf"],
                             "Q4/m-Q4_K_M.gguf") == "Q4/mmproj-F32.gguf"
    assert names.find_mmproj(LISTINGS["unsloth/GLM-4.5-Air-GGUF"], "GLM-4.5-Air-Q2_K.gguf") is None
