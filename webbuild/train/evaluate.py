"""Greedy transcription of held-out clips with the torch model, and word error rate.

`python -m webbuild.train.evaluate CKPT [N [LEAD_MS]]` prints the held-out WER of a saved checkpoint over
the same N clips that training evaluated (N = 500 by default), behind the front-end's LEAD_MS of lead
(model.yaml's default by default).
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.reference.prompt import parse_answer
from webbuild.reference.wer import corpus_wer
from webbuild.text import plural
from webbuild.train.batches import ClipStore, features, token_batch
from webbuild.train.dataset import synthesize_sharded
from webbuild.train.sentences import HELDOUT_SEED, heldout_sentences, load_vocabulary

MAX_NEW_TOKENS = 64


def wer(refs: list[str], hyps: list[str]) -> float:
    return corpus_wer(list(zip(refs, hyps)))


@torch.no_grad()
def transcribe(model, tok: Tokenizer, store: ClipStore, idx: torch.Tensor, lead: int = 0) -> list[str]:
    """Greedy decoding of clips `idx` in one left-padded batch, each behind `lead` samples of lead."""
    device = store.pcm.device
    feats, mask = features(store, idx, lead=lead)
    ids, att, _ = token_batch(store, idx, mask, tok, train=False)
    end = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    out = model.generate(
        input_ids=ids.to(device), attention_mask=att.to(device), input_features=feats,
        input_features_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
        eos_token_id=end, pad_token_id=end[1],
    )
    new = out[:, ids.shape[1]:].tolist()
    return [parse_answer(tok.decode(row, skip_special_tokens=False)) for row in new]


def heldout_wer(model, tok: Tokenizer, store: ClipStore, batch_size: int = 128,
                lead: int = 0) -> tuple[float, list[str]]:
    was_training = model.training
    model.eval()
    hyps = []
    for start in range(0, len(store), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(store)), device=store.pcm.device)
        hyps += transcribe(model, tok, store, idx, lead)
    model.train(was_training)
    return wer(store.texts, hyps), hyps



def main(argv=None):
    import sys
    from pathlib import Path

    from transformers import Qwen3ASRForConditionalGeneration

    args = sys.argv[1:] if argv is None else argv
    ckpt, n = Path(args[0]), int(args[1]) if len(args) > 1 else 500
    lead_ms = int(args[2]) if len(args) > 2 else DEFAULT_LEAD_MS
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    model = Qwen3ASRForConditionalGeneration.from_pretrained(ckpt).eval()
    clips = synthesize_sharded(heldout_sentences(load_vocabulary(), n), HELDOUT_SEED)
    score, _ = heldout_wer(model, tok, ClipStore.build(clips, tok, "cpu"), batch_size=64, lead=lead_samples(lead_ms))
    print(f"held-out WER over {plural(n, 'clip')}, {lead_ms} ms lead: {score:.4f}")


if __name__ == "__main__":
    main()
