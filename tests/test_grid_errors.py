"""A token grid too small for the masks is refused naming what the user set, for every JEPA objective
(masks/checks.validate_token_grid): the input size and the patch size that made the grid (a
`jepa train` flag, else the recipe key), never a --grid the objective derived, and the largest smaller
--patch-size that fits, when there is one."""

from __future__ import annotations

import pytest

from jepa_cli.errors import InputError
from jepa_cli.masks import MultiBlockConfig
from jepa_cli.masks.checks import validate


def _refusal(make) -> str:
    with pytest.raises(InputError) as refused:
        make()
    return str(refused.value)


def test_ijepa_names_the_image_and_patch_sizes_and_a_patch_size_that_fits():
    from jepa_cli.objectives.ijepa_config import IJEPAConfig

    assert _refusal(lambda: IJEPAConfig(image_size=32, patch_size=16).mask_config) == (
        "32x32 images in 16x16 patches (--image-size 32, --patch-size 16) make a 2x2 token grid, which cannot "
        "hold the target blocks: a block at --pred-scale 0.15,0.2 can be empty; a smaller patch gives a larger "
        "grid: --patch-size 4 makes 8x8")


def test_ijepa_without_a_patch_size_that_fits_still_names_the_sizes_not_a_grid():
    from jepa_cli.objectives.ijepa_config import IJEPAConfig

    assert _refusal(lambda: IJEPAConfig(image_size=2, patch_size=1).mask_config) == (
        "2x2 images in 1x1 patches (--image-size 2, --patch-size 1) make a 2x2 token grid, which cannot hold the "
        "target blocks: a block at --pred-scale 0.15,0.2 can be empty")


def test_vjepa_names_the_frames_tubelets_image_and_patch_sizes():
    from jepa_cli.objectives.vjepa import VJEPAConfig

    assert _refusal(lambda: VJEPAConfig(image_size=32, patch_size=16, num_frames=16, tubelet_size=2)) == (
        "16x32x32 clips in 2x16x16 patches (num_frames = 16, tubelet_size = 2, --image-size 32, --patch-size 16) "
        "make an 8x2x2 token grid, which cannot hold the target blocks of mask pair 1: a block at --pred-scale "
        "0.15,0.15 can be empty; a smaller patch gives a larger grid: --patch-size 8 makes 8x4x4")


def test_audio_jepa_names_the_spectrogram_and_patch_sizes():
    from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig

    config = AudioJEPAConfig(frames=32, mel_bins=16, patch_size=16, ratio=(0.9, 0.95))
    assert _refusal(lambda: config.mask_config) == (
        "32x16 spectrograms in 16x16 patches (frames = 32, mel_bins = 16, --patch-size 16) make a 2x1 token grid, "
        "which can leave an empty context at --ratio 0.9,0.95; a smaller patch gives a larger grid: --patch-size 4 "
        "makes 8x4")


def test_a_grid_the_user_gave_is_named_as_given():
    assert _refusal(lambda: validate(MultiBlockConfig(grid=(2, 2)))) == (
        "--grid 2x2 cannot hold the target blocks: a block at --pred-scale 0.15,0.2 can be empty")
