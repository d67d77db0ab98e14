"""``--crop_images_padding_mode``: SINGA's symmetric-padded crop from the distnn command."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from distnn.data import RandomCrop
from distnn.run import build_config
from distnn.run.build import build_augment

BIN = Path(sys.executable).parent / "distnn"
COMMAND = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "distnn.cli.main"]
SMALL = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "64",
         "--batch_size", "16", "--num_epochs", "1", "--evaluate", "false", "--quiet"]


def test_symmetric_crop_from_the_options():
    cfg = build_config("train", {"crop_images": True, "crop_images_prob": 1.0,
                                 "crop_images_padding_mode": "symmetric"})
    crop, = [a for a in build_augment(cfg) if isinstance(a, RandomCrop)]
    assert crop.padding_mode == "symmetric" and crop.padding == 4
    x = np.random.default_rng(0).random((32, 1, 28, 28)).astype(np.float32) + 0.5
    assert crop(x.copy(), np.random.default_rng(1)).min() >= 0.5  # no zero borders
    default = build_config("train", {"crop_images": True})
    assert [a for a in build_augment(default) if isinstance(a, RandomCrop)][0] \
        .padding_mode == "constant"


def test_the_command_trains_with_it_and_names_a_bad_mode(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    ok = subprocess.run([*COMMAND, "train", *SMALL, "--crop_images",
                         "--crop_images_padding_mode", "symmetric"], capture_output=True,
                        text=True, cwd=tmp_path, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    bad = subprocess.run([*COMMAND, "train", *SMALL, "--crop_images_padding_mode", "mirror"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert bad.returncode == 2
    assert "--crop_images_padding_mode" in bad.stderr and "symmetric" in bad.stderr
    assert "mirror" in bad.stderr
