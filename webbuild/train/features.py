"""Batched torch twin of `webbuild.reference.mel.log_mel`, for computing features on the GPU.

Each clip is framed exactly like the reference (its own lead, its reflect padding, its own max - 8
floor, T = (lead_length + len) // 160 frames), then the batch is padded to a multiple of 100
frames, the encoder's chunk.
"""

from __future__ import annotations

import torch

from webbuild.reference.mel import HOP, N_FFT, QUIET_RATIO, QUIET_WINDOW, hann_window, lead_noise, mel_filters

CHUNK = 100  # mel frames per encoder chunk (2 * n_window)


def _reflect_index(lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per clip, source indices of its reflect-padded signal (pad N_FFT // 2 both sides) and
    which of the `width` positions are real."""
    pad = N_FFT // 2
    k = torch.arange(width, device=lengths.device)[None, :] - pad
    n = lengths[:, None]
    idx = torch.where(k < 0, -k, torch.where(k >= n, 2 * (n - 1) - k, k))
    valid = k < n + pad
    return idx.clamp(min=0) * valid, valid


def _background(pcm: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, scale: float):
    """Per clip, the RMS of its quietest whole QUIET_WINDOW window and how many samples of background
    it starts with (`webbuild.reference.mel.quiet_level`, `lead_length`)."""
    windows = lengths // QUIET_WINDOW
    k = torch.arange(int(windows.max()) * QUIET_WINDOW, device=pcm.device)
    samples = pcm[(offsets[:, None] + k).clamp(max=len(pcm) - 1)].float() * scale
    energy = samples.square().view(len(lengths), -1, QUIET_WINDOW).sum(-1)
    whole = torch.arange(energy.shape[1], device=pcm.device)[None, :] < windows[:, None]
    quietest = energy.masked_fill(~whole, torch.inf).amin(1)
    loud = (energy > quietest[:, None] * QUIET_RATIO) | ~whole
    first_loud = torch.where(loud.any(1), loud.int().argmax(1), windows)
    return (quietest / QUIET_WINDOW).sqrt(), first_loud * QUIET_WINDOW


def log_mel_batch(pcm: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, scale: float = 1.0,
                  leads: torch.Tensor | int = 0):
    """Features of clips stored back to back in the 1-D tensor `pcm` (samples * `scale` = float PCM;
    int16 storage keeps a whole data set on the GPU), each behind its lead (`leads` samples at most:
    `webbuild.reference.mel.with_lead`).

    Returns (features [B, 128, Tpad] float32, mask [B, Tpad] long) with Tpad a multiple of CHUNK.
    Padding frames hold 0.
    """
    leads = torch.as_tensor(leads, device=lengths.device).expand_as(lengths)
    if int(leads.max()):
        level, quiet = _background(pcm, offsets, lengths, scale)
        leads = (leads - quiet).clamp(min=0) * (leads > 0)
    frames_n = (lengths + leads) // HOP
    t_max = int(frames_n.max())
    width = HOP * (t_max - 1) + N_FFT
    idx, valid = _reflect_index(lengths + leads, width)  # into each clip's lead + samples
    lead = leads[:, None]
    signal = pcm[offsets[:, None] + (idx - lead).clamp(min=0)].float() * scale
    if int(leads.max()):
        noise = torch.as_tensor(lead_noise(int(leads.max())), device=pcm.device)
        signal = torch.where(idx < lead, noise[idx.clamp(max=len(noise) - 1)] * level[:, None], signal)
    signal = signal * valid  # [B, width]
    frames = signal.unfold(-1, N_FFT, HOP)[:, :t_max]  # [B, T, 400]
    window = torch.as_tensor(hann_window(), device=pcm.device)
    power = torch.fft.rfft(frames * window, dim=-1).abs() ** 2
    mel = power @ torch.as_tensor(mel_filters(), device=pcm.device)  # [B, T, 128]
    logm = torch.log10(mel.clamp(min=1e-10))
    mask = torch.arange(t_max, device=pcm.device)[None, :] < frames_n[:, None]
    peak = logm.masked_fill(~mask[:, :, None], -torch.inf).amax(dim=(1, 2))
    feats = (torch.maximum(logm, (peak - 8.0)[:, None, None]) + 4.0) / 4.0
    t_pad = -(-t_max // CHUNK) * CHUNK
    out = feats.new_zeros(feats.shape[0], t_pad, feats.shape[-1])
    out[:, :t_max] = feats * mask[:, :, None]
    full_mask = torch.arange(t_pad, device=pcm.device)[None, :] < frames_n[:, None]
    return out.transpose(1, 2).contiguous(), full_mask.long()
