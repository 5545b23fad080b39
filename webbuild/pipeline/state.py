"""What the build's stages hand each other: the source model, the precision variants, the build state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from webbuild.config import BuildConfig
from webbuild.layouts import Layout
from webbuild.pipeline.build_report import BuildReport
from webbuild.site.contract import VARIANTS


@dataclass
class SourceModel:
    """The source export, read in place (no stage writes to it), and the fuse stage's graphs."""

    dir: Path
    layout: Layout  # model.yaml's source.layout
    decoder: Path | None = None  # one fused decoder graph with the merged interface
    encoder: Path | None = None  # the fused encoder, weights still float

    @property
    def decoder_source(self) -> Path:
        """What the fuse stage reads: the layout's prefill decoder graph."""
        return self.dir / self.layout.prefill


@dataclass
class Variant:
    """One precision variant of the site's model: file names in `dir` by role (encoder, encoder_data,
    decoder, decoder_data, embed, decoder_wasm, decoder_step, encoder_wasm, decoder_lora*: the roles of
    webbuild.site.contract.FILE_ROLES), in the order the manifest lists them."""

    name: str  # fp16 | fp32
    dir: Path
    files: dict[str, str] = field(default_factory=dict)
    # the adapted step form's lora inputs: how each is made from an adapter's tensors
    # (webbuild.forms.lora.step_layout); the manifest entry's `lora_layout`
    lora_layout: dict[str, dict] = field(default_factory=dict)
    # the weights the decoder's shared-weights forms take as inputs, where each lies in decoder_data
    # (webbuild.forms.shared_weights.weights_table); the manifest entry's `weights`
    weights: dict[str, dict] = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        """The float type of audio_features, past and present."""
        return VARIANTS[self.name]["dtype"]

    @property
    def requires(self) -> list[str]:
        """WebGPU features an adapter needs to run this variant."""
        return VARIANTS[self.name]["requires"]

    @property
    def providers(self) -> list[str]:
        """The execution providers that may run this variant."""
        return VARIANTS[self.name]["providers"]

    def path(self, role: str) -> Path:
        return self.dir / self.files[role]


@dataclass
class BuildState:
    """What the stages have made so far."""

    model: SourceModel
    assembled: Path | None = None  # the assemble stage's folder: runtime.json, tokens.bin, config.json
    # by variant name: the quantize stage's files, then (from the forms stage on) every file as it ships
    variants: dict[str, Variant] = field(default_factory=dict)
    wasm_plans: dict[str, dict] = field(default_factory=dict)  # fp32 variants' wasm plans (forms stage)
    adapter_files: dict[str, Path] = field(default_factory=dict)  # adapter.<name>.bin -> packed file
    adapters: dict[str, dict] = field(default_factory=dict)  # the manifest's `adapters` entries
    manifest: dict | None = None  # dist/model/manifest.json, once the shard stage wrote it

    @property
    def assembled_dir(self) -> Path:
        """`assembled`, for the stages after the assemble stage."""
        if self.assembled is None:
            raise RuntimeError("the assemble stage has not run")
        return self.assembled


@dataclass
class BuildContext:
    cfg: BuildConfig
    stage_dir: Path  # the site being built; it replaces the output folder once every stage succeeded
    work_dir: Path  # scratch space beside the site: model files never land in dist/ unsharded
    report: BuildReport
    state: BuildState
