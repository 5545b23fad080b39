"""`webbuild init`: the model.yaml it writes builds, its commented defaults are the schema's, its workflow is
valid YAML that builds, verifies (JUnit) and deploys; bad input is one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.command import parse_command, webbuild
from tests.example_config import EXAMPLE, REPO
from webbuild.config import load_config
from webbuild.tools.browser import CHANNELS


@pytest.fixture
def project(tmp_path) -> Path:
    """A folder holding a copy of the example's export (My Export/: a name to make a model id of) and its clips."""
    shutil.copytree(EXAMPLE / "model", tmp_path / "My Export")
    shutil.copytree(EXAMPLE / "samples", tmp_path / "clips")
    return tmp_path


def init(project: Path, *args):
    return webbuild("init", *args, cwd=project)


def test_the_written_model_yaml_builds(project):
    r = init(project, "My Export", "--samples", "clips")
    assert r.returncode == 0, r.stderr
    cfg = load_config(project / "model.yaml")
    assert cfg.name == "my-export" and cfg.source.layout == "qwen3-asr-split"
    assert cfg.source.dir == project / "My Export"
    example = load_config(EXAMPLE / "model.yaml").site.samples
    assert [(s.audio.name, s.text) for s in cfg.site.samples] == [(s.audio.name, s.text) for s in example]
    b = webbuild(project / "model.yaml")  # output: dist/ beside it
    assert b.returncode == 0, b.stderr[-2000:]
    samples = json.loads((project / "dist" / "samples.json").read_text())
    assert [s["text"] for s in samples["samples"]] == [s.text for s in example]


def test_the_commented_defaults_are_the_schemas(project):
    assert init(project, "My Export", "--name", "mine").returncode == 0
    text = (project / "model.yaml").read_text()
    commented = re.findall(r"^# ([a-z_]+: .*?)  # ", text, re.M)
    assert [line.split(":")[0] for line in commented] == ["variants", "fusion", "quantize", "encoder", "chunking",
                                                          "shard", "verify"]
    (project / "all.yaml").write_text(text + "".join(f"{line}\n" for line in commented))
    plain, uncommented = load_config(project / "model.yaml"), load_config(project / "all.yaml")
    assert uncommented.name == "mine"
    assert uncommented.model_dump(exclude={"config_path"}) == plain.model_dump(exclude={"config_path"})


def test_the_pages_workflow_builds_verifies_and_deploys(project):
    r = init(project, "My Export", "--samples", "clips", "--workflow", "pages", "--webbuild",
             "webbuild-asr[verify] @ ./wheels/webbuild_asr.whl")
    assert r.returncode == 0, r.stderr
    workflow = yaml.safe_load((project / ".github" / "workflows" / "pages.yml").read_text())
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    assert workflow["env"]["WEBBUILD"] == "webbuild-asr[verify] @ ./wheels/webbuild_asr.whl"
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["steps"][0]["uses"].startswith("actions/deploy-pages@")
    uses = [s["uses"].split("@")[0] for s in build["steps"] if "uses" in s]
    assert uses == ["actions/checkout", "actions/setup-python", "actions/upload-artifact", "actions/configure-pages",
                    "actions/upload-pages-artifact"]
    runs = [s["run"] for s in build["steps"] if "run" in s]
    assert runs[:2] == ['python -m pip install "$WEBBUILD"', "python -m playwright install --with-deps chromium"]
    (_, built), (_, verified) = [parse_command(line) for line in runs if line.startswith("webbuild ")]
    assert built["config"] == Path("model.yaml") and built["output"] == Path("dist")
    assert verified["target"] == "dist" and verified["browser"] in CHANNELS and verified["junit"]
    upload = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "dist"


def test_the_pages_workflow_installs_this_distribution_at_this_version(project):
    """`webbuild` on the package index is an unrelated project: the workflow installs pyproject.toml's
    distribution (webbuild-asr) with the verify extra, pinned to the version that wrote it."""
    pyproject = (REPO / "pyproject.toml").read_text()  # tomllib is 3.11's; webbuild runs on 3.10
    meta = dict(re.findall(r'^(name|version) = "(.*)"$', pyproject, re.M))
    assert meta["name"] == "webbuild-asr"
    r = init(project, "My Export", "--samples", "clips", "--workflow", "pages")
    assert r.returncode == 0, r.stderr
    workflow = yaml.safe_load((project / ".github" / "workflows" / "pages.yml").read_text())
    assert workflow["env"]["WEBBUILD"] == f"webbuild-asr[verify]=={meta['version']}"


def test_a_pages_workflow_without_samples_is_refused(project):
    """The workflow's verify transcribes the page's samples: without any it could only ever fail ("0/0 clips"),
    so init says so and writes nothing."""
    before = sorted(project.rglob("*"))
    r = init(project, "My Export", "--workflow", "pages")
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        "error: --workflow pages: the workflow's `webbuild verify` transcribes the page's sample clips, and "
        "there are none; pass --samples (WAVs, or a folder of them, each with a same-named .txt transcript)"])
    assert sorted(project.rglob("*")) == before


@pytest.mark.parametrize("args, error", [
    (["nowhere"], "error: nowhere: no such folder; pass the folder of a Qwen3-ASR ONNX export"),
    (["clips"], "error: clips is not a Qwen3-ASR ONNX export: it holds none of decoder_init.onnx (qwen3-asr-split), "
                "decoder_model_merged.onnx (merged), decoder_init.int4.onnx (qwen3-asr-v2)"),
    (["My Export", "--samples", "My Export"], "error: --samples My Export: the folder holds no .wav file"),
    (["My Export", "--samples", "lonely.wav"], "error: --samples: lonely.wav has no transcript; put its text into "
                                               "lonely.txt"),
    (["My Export", "--name", "Bad Name"], "error: My Export: cannot make a model name of the folder name; give one "
                                          "with --name (lower-case letters, digits, . _ -)"),
    (["My Export", "-o", "site/model.yaml"], "error: -o site/model.yaml: folder site does not exist; create it first"),
])
def test_bad_input_is_one_line_and_writes_nothing(project, args, error):
    shutil.copyfile(project / "clips" / "sample-1.wav", project / "lonely.wav")
    before = sorted(project.rglob("*"))
    r = init(project, *args)
    assert (r.returncode, r.stderr.splitlines()) == (2, [error])
    assert sorted(project.rglob("*")) == before


def test_a_side_file_the_layout_needs_is_named(project):
    (project / "My Export" / "tokenizer.json").unlink()
    r = init(project, "My Export")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "lacks tokenizer.json, which layout 'qwen3-asr-split' needs" in r.stderr and ".model-" not in r.stderr
    assert not (project / "model.yaml").exists()


def test_an_existing_model_yaml_is_kept_unless_forced(project):
    (project / "model.yaml").write_text("mine\n")
    r = init(project, "My Export", "--workflow", "pages")
    assert (r.returncode, r.stderr.strip()) == (2, "error: model.yaml exists; pass --force to overwrite it")
    assert (project / "model.yaml").read_text() == "mine\n" and not (project / ".github").exists()
    r = init(project, "My Export", "--samples", "clips", "--workflow", "pages", "--force")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["wrote model.yaml", "wrote .github/workflows/pages.yml",
                                     "build it: webbuild model.yaml"]
    assert load_config(project / "model.yaml").name == "my-export"
