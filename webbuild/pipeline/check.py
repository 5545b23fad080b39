"""The check stage's work: every graph a variant ships, run on onnxruntime CPU on the sample clips and
compared with the unfused source export, one row per role.

What runs for each role (a graph onnxruntime CPU refuses runs through its CPU form: the Q/K norms taken
back out of GroupQueryAttention, webbuild.reference.transcribe.cpu_form; everything else as shipped):

- `encoder` and `decoder`: the WebGPU path, greedy tokens against the source's;
- `encoder_wasm` / `decoder_wasm`: the wasm path (the twins, the encoder where it has none), against the source;
- `decoder_step`: the captured decode's graph, as runtime/capture.js drives it: the plain decoder's prefill,
  then the step form on a static KV cache of runtime.json's `max_positions`, feeding each `next_token` back;
- `decoder_lora*`: the adapted forms fed a zero adapter of the adapters' rank, whose tokens must equal
  the base form's; the adapted step and wasm forms also fed a non-zero random adapter (the step's inputs made by
  the manifest variant's `lora_layout`, adapter_pack.step_inputs, as the page makes them), whose logits along the
  Python reference's tokens (the plain adapted decoder with that adapter, as `webbuild transcribe --adapter` runs
  it) must stay within ADAPTER_TOLERANCE of the adapter's own effect on them, beyond the form's own distance from
  the reference with a zero adapter (an int8 twin's): a wrong packing moves them by about that effect; the delta
  graph (`decoder_lora_delta`) on a random adapter against adapter_pack.delta_inputs.

`webbuild.reference.transcribe.IdsDecoder` drives the built decoder interface (input_ids + audio splice,
webbuild.quantize.embeddings), so one greedy loop (`Transcriber`) serves built graphs and the unfused
source alike.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from tokenizers import Tokenizer

from webbuild.adapters import DOWN_GROUPS, RANK, shared_rank
from webbuild.forms import shared_weights
from webbuild.forms.lora_delta import differences, random_layer, run_layer
from webbuild.pipeline.state import Variant
from webbuild.reference.prompt import Prompt
from webbuild.reference.transcribe import (
    IdsDecoder,
    MergedDecoder,
    SiteCodec,
    TokenizerCodec,
    Transcriber,
    cpu_form,
    cpu_session,
    embed_table,
    load_transcriber,
    pick,
    takes_token_ids,
)
from webbuild.reference.wer import edit_distance
from webbuild.site.adapter_pack import delta_inputs, step_inputs
from webbuild.site.contract import DELTA_GROUPS, FILE_ROLES, IO

DEFAULT_MAX_NEW_TOKENS = 64
# the random adapter's check (RoleCheck.adapter_values): each up's values N(0, ADAPTER_SCALE / sqrt(rank)) and each
# down's N(0, 1 / sqrt(in)), so an update is about ADAPTER_SCALE x its input's RMS; compared over ADAPTER_STEPS
# decode steps of the first ADAPTER_CLIPS clips. The step form quantizes the adapter (4- and 8-bit blocks): on the
# example its logits stay within 0.11 of the adapter's effect, while a packed up or a merged update made from the
# wrong ups moves them by more than half of it (tests/test_adapter_build.py)
ADAPTER_SCALE, ADAPTER_TOLERANCE, ADAPTER_STEPS, ADAPTER_CLIPS = 0.2, 0.25, 16, 2
DELTA_ROLE = FILE_ROLES["decoder_lora"]["delta"]  # a graph no decoder run reads: its own row (RoleCheck._delta_row)
# the adapted forms checked with a random adapter against the plain adapted decoder (RoleCheck.adapter_values)
ADAPTER_CHECKED = (FILE_ROLES["decoder_lora"]["step"], FILE_ROLES["decoder_lora"]["wasm"])
# the shared-weights forms (webbuild.forms.shared_weights) by role, with the graph each is a form of
SHARED_ROLES = {FILE_ROLES["decoder"]["shared"]: FILE_ROLES["decoder"]["graph"],
                FILE_ROLES["decoder"]["step_shared"]: FILE_ROLES["decoder"]["step"]}


def variant_transcriber(out_dir: Path, variant: str, side_dir: Path) -> Transcriber:
    """Transcriber over encoder.<variant>.onnx + decoder.<variant>.onnx; tokenizer/config from side_dir."""
    return role_transcriber(Path(out_dir) / f"encoder.{variant}.onnx", Path(out_dir) / f"decoder.{variant}.onnx",
                            side_dir)


def role_transcriber(encoder: Path, decoder: Path, side_dir: Path, rank: int | None = None) -> Transcriber:
    """Transcriber over the graphs `encoder` and `decoder` (taking input_ids); tokenizer/config from side_dir.
    With `rank`, an adapted decoder's lora.* inputs are zeros of that rank (a zero adapter)."""
    cfg = json.loads((Path(side_dir) / "config.json").read_text())
    decoder_runner: IdsDecoder | MergedDecoder
    if takes_token_ids(decoder):
        decoder_runner = IdsDecoder(decoder, cfg["decoder"])
        if rank is not None:
            decoder_runner.adapter = zero_adapter(decoder_runner, rank)
    else:  # a float build's (quantize.method none): the page looks the tokens up in embed_tokens.bin, so does this
        decoder_runner = MergedDecoder(decoder.parent, (decoder.name,), embed_table(Path(side_dir), cfg), cfg)
    return Transcriber(cpu_session(encoder), decoder_runner,
                       TokenizerCodec(Tokenizer.from_file(str(Path(side_dir) / "tokenizer.json"))),
                       frozenset(cfg["special_tokens"]["eos_token_ids"]))


def random_adapter(decoder: IdsDecoder, rank: int, seed: int = 0,
                   scale: float = ADAPTER_SCALE) -> dict[str, np.ndarray]:
    """A non-zero random adapter of `rank` for every lora.* input of the adapted `decoder`, in
    adapter_pack.graph_inputs' form: each group's down [in, R] N(0, 1 / sqrt(in)), each up [R, out] N(0, scale /
    sqrt(rank)) in its projection's own rows of the group's R (zeros elsewhere)."""
    rng, out = np.random.default_rng(seed), {}
    for i in decoder.sess.get_inputs():
        if (parts := IO.lora_parts(i.name)) is None:
            continue
        _, owner, factor = parts
        group = next(g for g, projs in DOWN_GROUPS.items() if owner == g or owner in projs)
        shared = shared_rank(group, rank)
        if factor == "down":
            out[i.name] = rng.normal(0, 1 / np.sqrt(i.shape[0]), (i.shape[0], shared)).astype(decoder.dtype)
            continue
        at = DOWN_GROUPS[group].index(owner) * rank
        up = out[i.name] = np.zeros((shared, i.shape[1]), decoder.dtype)
        up[at:at + rank] = rng.normal(0, scale / np.sqrt(rank), (rank, i.shape[1]))
    return out


def zero_adapter(decoder: IdsDecoder, rank: int) -> dict[str, np.ndarray]:
    """Zeros for every lora.* input of `decoder` ([in, r] and [r, out], r = `rank` times the group's members)."""
    inputs = [(i, parts) for i in decoder.sess.get_inputs() if (parts := IO.lora_parts(i.name))]
    return {i.name: np.zeros([d if isinstance(d, int) else shared_rank(owner, rank) for d in i.shape], decoder.dtype)
            for i, (_, owner, _) in inputs}


def forced_logits(decoder: IdsDecoder, prompt: Prompt, audio: np.ndarray, tokens: list[int]) -> np.ndarray:
    """`decoder`'s logits [len(tokens), vocab] after each of `tokens` (teacher forcing), after the prompt and audio."""
    _, state = decoder.prefill(prompt, audio)
    rows = []
    for token in tokens:
        logits, state = decoder.step(token, state)
        rows.append(logits)
    return np.array(rows)


def reference_tokens(reference_dir: Path, clips: dict[str, np.ndarray],
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, lead: int = 0) -> dict[str, list[int]]:
    """Greedy tokens of the fp32 unfused source export (any layout); an encoder taking mel
    gets `lead` samples of lead before the audio, as the built front-end does."""
    ref = load_transcriber(reference_dir, lead=lead)
    return {name: ref.generate(pcm, max_new_tokens) for name, pcm in clips.items()}


def check_variant(t: Transcriber, clips: dict[str, np.ndarray], reference: dict[str, list[int]] | None,
                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> dict:
    """Transcripts of `clips` and, given reference tokens, per-clip token agreement (1 - edit distance / len)."""
    return agreement({name: t.generate(pcm, max_new_tokens) for name, pcm in clips.items()}, t.codec, reference)


def agreement(tokens: dict[str, list[int]], codec: TokenizerCodec | SiteCodec,
              reference: dict[str, list[int]] | None) -> dict:
    """Transcripts of each clip's `tokens` and, given reference tokens, per-clip token agreement."""
    report: dict = {"transcripts": {name: codec.decode(ids) for name, ids in tokens.items()},
                    "token_agreement": {}}
    if reference is not None:
        report["token_agreement"] = {name: 1.0 - edit_distance(reference[name], ids) / max(len(reference[name]), 1)
                                     for name, ids in tokens.items()}
    if report["token_agreement"]:
        report["mean_token_agreement"] = float(np.mean(list(report["token_agreement"].values())))
    return report


def link_or_copy(src: Path, dest: Path) -> None:
    """`dest` as a hard link of `src` where the file system allows (a multi-GB weights file costs
    nothing), else a copy. Only for files onnxruntime reads: onnx itself refuses to load external data
    from a file with several links."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


class RoleCheck:
    """The check of one shipped variant (`v`, the forms stage's folder) on `clips` against `reference`
    (the source's tokens); CPU forms are written into `scratch`, next to links of the weights files."""

    def __init__(self, v: Variant, side_dir: Path, scratch: Path, clips: dict[str, np.ndarray],
                 reference: dict[str, list[int]] | None, max_positions: int, rank: int | None):
        self.v, self.side_dir, self.scratch, self.clips = v, side_dir, scratch, clips
        self.reference, self.max_positions, self.rank = reference, max_positions, rank
        self.decoded: dict[tuple, dict[str, list[int]]] = {}  # tokens by clip, per run (sessions not kept)
        self.codec = TokenizerCodec(Tokenizer.from_file(str(Path(side_dir) / "tokenizer.json")))
        self.cpu_forms: dict[str, Path] = {}
        scratch.mkdir(parents=True, exist_ok=True)
        for name in v.files.values():  # the CPU forms read the same weights files
            if not name.endswith(".onnx") and not (scratch / name).exists():
                link_or_copy(v.dir / name, scratch / name)

    def rows(self) -> dict[str, dict]:
        """A row per graph role of the variant (every role whose file is a graph), in the manifest's order."""
        return {role: self._delta_row() if role == DELTA_ROLE else self._shared_row(role) if role in SHARED_ROLES
                else self._row(role) for role, name in self.v.files.items() if name.endswith(".onnx")}

    def _shared_row(self, role: str) -> dict:
        """A shared-weights form (webbuild.forms.shared_weights), which decodes as its graph does once fed the
        manifest's weights: compared with that graph as a graph, not run again."""
        graph = SHARED_ROLES[role]
        problems = shared_weights.differences(self.v.path(graph), self.v.path(role), self.v.weights,
                                              self.v.files["decoder_data"])
        return {"file": self.v.files[role], "ran": "compared as a graph", "with": [],
                "against": f"{graph} with the manifest's weights as inputs", "values_equal": not problems,
                "problems": problems}

    def _delta_row(self) -> dict:
        """The delta graph (webbuild.forms.lora_delta), which no decoder run reads: run on a random adapter of the
        adapters' rank for the adapted decoder's layer 0 against adapter_pack.delta_inputs."""
        graph = onnx.load(str(self.v.path("decoder_lora")), load_external_data=False).graph
        dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
        n_out = {p: dims[IO.lora_input(0, p, "up")][1] for g in DELTA_GROUPS for p in DOWN_GROUPS[g]}
        inputs = random_layer(dims[IO.lora_input(0, DELTA_GROUPS[0], "down")][0], n_out, self.rank or RANK)
        dtype = np.float16 if self.v.dtype == "float16" else np.float32
        problems = differences(run_layer(self.v.path(DELTA_ROLE), inputs), delta_inputs(inputs, dtype))
        return {"file": self.v.files[DELTA_ROLE], "ran": "as shipped", "with": [],
                "against": "adapter_pack.delta_inputs (a random adapter)", "values_equal": not problems,
                "problems": problems}

    def _run(self, role: str) -> tuple[str, str, str | None]:
        """(encoder, decoder, step form or None): the roles that run together to check `role`."""
        wasm = role.endswith("_wasm")
        encoder = "encoder_wasm" if wasm and "encoder_wasm" in self.v.files else "encoder"
        if role.startswith("encoder"):
            decoder = "decoder_wasm" if wasm and "decoder_wasm" in self.v.files else "decoder"
            return encoder, decoder, None
        if role.endswith("_step"):
            return encoder, role.removesuffix("_step"), role
        return encoder, role, None

    def _row(self, role: str) -> dict:
        """The role's file, how it ran, and its tokens against the source (adapted roles: against the base
        role's tokens, which a zero adapter must give exactly)."""
        run = self._run(role)
        tokens = self._decode(run)
        row: dict = {"file": self.v.files[role],
                     "ran": "cpu form" if self._cpu(role) != self.v.path(role) else "as shipped",
                     "with": [r for r in run if r and r != role]}
        if role.startswith("decoder_lora"):
            base = tuple(r.replace("decoder_lora", "decoder") if r else r for r in run)
            against = f"{role.replace('decoder_lora', 'decoder')} (zero adapter)"
            row |= {"against": against, "tokens_equal": tokens == self._decode(base)}
            if role in ADAPTER_CHECKED:
                row |= self.adapter_values(role) | {"against": f"{against} and decoder_lora (a random adapter)"}
            return row
        return row | {"against": "source" if self.reference is not None else "none (no sample clips)"} \
            | agreement(tokens, self.codec, self.reference)

    def adapter_values(self, role: str) -> dict:
        """The adapted `role` fed a random adapter (random_adapter) against the Python reference, the plain adapted
        decoder with it: their logits along the reference's greedy tokens of the first clips (teacher forcing),
        whose largest difference must stay within ADAPTER_TOLERANCE of the largest difference the adapter makes
        (the reference's logits against its own with a zero adapter), beyond the role's own largest difference
        from the reference with a zero adapter."""
        t = role_transcriber(self.v.path("encoder"), self._cpu("decoder_lora"), self.side_dir, self.rank or RANK)
        assert isinstance(t.decoder, IdsDecoder), "a built site's decoder takes input_ids"
        reference, zero = t.decoder, t.decoder.adapter
        reference.adapter = random_adapter(reference, self.rank or RANK)
        inputs = []
        for pcm in list(self.clips.values())[:ADAPTER_CLIPS]:
            audio = t.audio_features(pcm)
            inputs.append((t.codec.prompt(audio.shape[1]), audio, t.generate(pcm, ADAPTER_STEPS)))
        want = [forced_logits(reference, *clip) for clip in inputs]
        got = [self._forced_role(role, reference, *clip) for clip in inputs]
        reference.adapter = zero
        base = [forced_logits(reference, *clip) for clip in inputs]
        effect = max(float(np.abs(w - b).max()) for w, b in zip(want, base))
        difference = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
        floor = 0.0
        if difference > ADAPTER_TOLERANCE * effect:
            # the form's own distance from the reference without an adapter (an int8 twin's quantized activations):
            # the adapter's part of the difference is what lies beyond it (measured only where it matters: its
            # sessions are made again)
            floor = max(float(np.abs(self._forced_role(role, reference, *clip) - b).max())
                        for b, clip in zip(base, inputs))
        equal = effect > 0 and difference <= ADAPTER_TOLERANCE * effect + floor
        problems = [] if equal else [f"a random adapter: logits {difference:.3g} from the reference's, its effect "
                                     f"{effect:.3g} (at most {ADAPTER_TOLERANCE} of it beyond the form's own "
                                     f"{floor:.3g} without one)"]
        return {"random_adapter": {"difference": difference, "effect": effect, "floor": floor},
                "values_equal": equal, "problems": problems}

    def _forced_role(self, role: str, reference: IdsDecoder, prompt: Prompt, audio: np.ndarray,
                     tokens: list[int]) -> np.ndarray:
        """`role`'s logits after each of `tokens`, fed the reference's adapter (the step form: made by the
        manifest variant's lora_layout, its prefill the reference's, as runtime/capture.js runs it)."""
        if role.endswith("_step"):
            form = StepForm(self._cpu(role), self.max_positions, reference, self.v.lora_layout,
                            logits_copy=self.scratch / f"{self.v.files[role]}.logits.onnx")
            return form.forced_logits(prompt, audio, tokens)
        cfg = json.loads((Path(self.side_dir) / "config.json").read_text())
        return forced_logits(IdsDecoder(self._cpu(role), cfg["decoder"], reference.adapter), prompt, audio, tokens)

    def _decode(self, run: tuple) -> dict[str, list[int]]:
        """Greedy tokens of every clip through the roles of `run`, once per run; its sessions are released
        after it (a large model's sessions would not fit side by side)."""
        if run not in self.decoded:
            encoder, decoder, step = run
            rank = self.rank if decoder.startswith("decoder_lora") else None
            t = role_transcriber(self.v.path(encoder), self._cpu(decoder), self.side_dir, rank)
            if step is None:
                tokens = {name: t.generate(pcm, DEFAULT_MAX_NEW_TOKENS) for name, pcm in self.clips.items()}
            else:
                assert isinstance(t.decoder, IdsDecoder), "a built site's decoder takes input_ids"
                layout = self.v.lora_layout if decoder.startswith("decoder_lora") else {}
                form = StepForm(self._cpu(step), self.max_positions, t.decoder, layout)
                tokens = {name: form.generate(t, pcm, DEFAULT_MAX_NEW_TOKENS) for name, pcm in self.clips.items()}
            self.decoded[run] = tokens
        return self.decoded[run]

    def _cpu(self, role: str) -> Path:
        """The role's graph in the form onnxruntime CPU opens: a CPU form in the scratch folder, else as shipped
        (a wasm twin always: it is the explicit form, and an int8 twin's derived weights are beside it only as
        a plan, webbuild.reference.transcribe.cpu_session)."""
        if role.endswith("_wasm"):
            return self.v.path(role)
        if role not in self.cpu_forms:
            copy = self.scratch / self.v.files[role]
            link_or_copy(self.v.path(role), copy)
            cpu = cpu_form(copy)
            self.cpu_forms[role] = cpu if cpu != copy else self.v.path(role)
        return self.cpu_forms[role]


class StepForm:
    """The step form (webbuild.forms.step) decoding after a plain prefill, as runtime/capture.js
    does: past and present are one static [1, kv, max_positions, hd] cache per layer, the mask has ones up
    to the current position, and each step's `next_token` is the next step's `input_ids`. An adapted step's
    lora inputs are made from the plain decoder's adapter as `layout` says (the manifest variant's `lora_layout`,
    adapter_pack.step_inputs), as the page makes them."""

    def __init__(self, path: Path, max_positions: int, plain: IdsDecoder, layout: dict[str, dict] | None = None,
                 logits_copy: Path | None = None):
        """logits_copy: where to write a copy of the graph that also answers its logits (forced_logits), beside
        its weights file."""
        if logits_copy is not None:
            model = onnx.load(str(path), load_external_data=False)
            dtype = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(plain.dtype))
            model.graph.output.append(onnx.helper.make_tensor_value_info(IO.logits, dtype, None))
            onnx.save(model, str(logits_copy))
        self.sess = cpu_session(logits_copy or path)
        self.max_positions, self.plain = max_positions, plain
        inputs = {i.name: i for i in self.sess.get_inputs()}
        self.present_of = IO.present_of_past(list(inputs))  # {past input: the present output it becomes}
        feeds = step_inputs(plain.adapter, layout or {}, lambda name: np.memmap(path.parent / name, np.uint8, mode="r"),
                            plain.dtype)
        self.adapter = {n: w for n, w in feeds.items() if n in inputs}
        self.mask_dtype = np.int32 if inputs[IO.attention_mask].type == "tensor(int32)" else np.int64

    def generate(self, t: Transcriber, pcm: np.ndarray, max_new_tokens: int) -> list[int]:
        """Greedy tokens of `pcm` (end of sequence left out)."""
        audio = t.audio_features(pcm)
        prompt: Prompt = t.codec.prompt(audio.shape[1])
        logits, (past, total) = self.plain.prefill(prompt, audio)
        cache = {n: self._static(past[n]) for n in self.present_of}
        token = pick(logits)[0]
        tokens: list[int] = []
        while token not in t.eos_ids and len(tokens) < max_new_tokens and total < self.max_positions:
            tokens.append(token)
            named, cache = self._step(token, cache, total)
            token, total = int(named[IO.next_token][0, 0]), total + 1
        return tokens

    def forced_logits(self, prompt: Prompt, audio: np.ndarray, tokens: list[int]) -> np.ndarray:
        """The logits [len(tokens), vocab] after each of `tokens` (teacher forcing), float32; the graph must answer
        them (logits_copy)."""
        _, (past, total) = self.plain.prefill(prompt, audio)
        cache, rows = {n: self._static(past[n]) for n in self.present_of}, []
        for token in tokens:
            named, cache = self._step(token, cache, total)
            rows.append(named[IO.logits].reshape(-1).astype(np.float32))
            total += 1
        return np.array(rows)

    def _step(self, token: int, cache: dict, total: int) -> tuple[dict, dict]:
        """One step's outputs by name, and the next step's cache."""
        mask = np.zeros((1, self.max_positions), self.mask_dtype)
        mask[0, :total + 1] = 1
        out = self.sess.run(None, {IO.input_ids: np.array([[token]], np.int32), IO.attention_mask: mask,
                                   **cache, **self.adapter})
        named = dict(zip([o.name for o in self.sess.get_outputs()], out))
        return named, {past: named[present] for past, present in self.present_of.items()}

    def _static(self, present: np.ndarray) -> np.ndarray:
        cache = np.zeros(present.shape[:2] + (self.max_positions,) + present.shape[3:], present.dtype)
        cache[:, :, :present.shape[2]] = present
        return cache
