"""`dtp fit --model-dir` on a modular pipeline folder (`modular_model_index.json`, as FLUX.3 is released): the same
components as the released flux3-pipeline, built from the folder's configs on meta, and a fit of one GPU."""

import pytest
import torch

import dtp
from dtp.errors import PlanError
from dtp.fit.pipelines import fit_pipeline
from dtp.testing.released_pipelines import save_tiny_flux3, tiny_flux3_pipeline


@pytest.fixture(scope="module")
def flux3_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flux3") / "FLUX.3"
    save_tiny_flux3(folder)
    return str(folder)


def _shapes(module: torch.nn.Module) -> dict:
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def test_fit_reads_a_modular_folder_as_the_released_pipeline(flux3_folder):
    """The tiny FLUX.3 folder: the released flux3-pipeline's components and guidance (its guider's two calls), each
    built on meta with the parameters of the pipeline that was saved; the index's prompt upsampler, absent from the
    folder, is left out."""
    pipeline = fit_pipeline(flux3_folder)
    released = fit_pipeline("flux3-pipeline")
    assert pipeline.modular and dict(pipeline.classes) == dict(released.classes)
    assert pipeline.guidance == released.guidance == (1, 1)
    saved = tiny_flux3_pipeline()
    for name in pipeline.classes:
        built = pipeline.build(name, torch.float32)
        assert next(built.parameters()).device.type == "meta"
        assert _shapes(built) == _shapes(getattr(saved, name)), name


@pytest.mark.full  # a fit traces every component (~50 s on the loaded 2-core machine); the reading above is the default
def test_fit_of_a_modular_folder_runs(flux3_folder):
    """One GPU, 64 x 64: every row fits 80 GB, each costs the folder's three components, its command names it."""
    rows = dtp.fit(flux3_folder, 1, "80GB", height=64, width=64, dtype="fp32", only={"quant": None})["rows"]
    assert rows and all(r["fits"] for r in rows)
    assert set(rows[0]["weight_bytes"]) == {"transformer", "text_encoder", "vae"}
    assert rows[0]["command"].startswith(f"python -m dtp run --model-dir {flux3_folder}")


def test_a_folder_without_an_index_is_refused(tmp_path):
    (tmp_path / "transformer").mkdir()
    with pytest.raises(PlanError, match="modular_model_index.json"):
        fit_pipeline(str(tmp_path))
