"""Reliability: folder walks that end on link loops and count each image once; images of any size in
predict; a segmentation row for every detection; class folders a classifier can learn from."""

import os
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

from yolotrain import Yolov5
from yolotrain.boxes import letterbox_geometry
from yolotrain.data.augment import letterbox
from yolotrain.data.check import check_classify_dataset
from yolotrain.data.classify import build_classify_loaders, resolve_classify_source, split_samples
from yolotrain.data.sources import list_images
from yolotrain.data.verify import DataWarning
from yolotrain.data.walk import FolderWalkWarning, walk_folders
from yolotrain.engine import Trainer, resolve_config
from yolotrain.eval.masks import masks_to_polygons, polygons_or_boxes
from yolotrain.model.classify import Classifier
from yolotrain.prediction import predict
from yolotrain.prediction.run import expand_sources
from yolotrain.settings import ConfigError
from yolotrain.tasks.segment.evaluate import polygon_rows

# (h, w) of images at the limits: one pixel high or wide, one pixel in all, and very long ones.
EXTREME_SHAPES = ((3, 2001), (1, 1), (2001, 3), (1, 3001), (2, 1))


def write_images(folder: Path, count: int, size: int = 24, start: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + count):
        path = folder / f"{i:03d}.png"
        cv2.imwrite(str(path), np.full((size, size, 3), 40 * i % 256, np.uint8))
        paths.append(path)
    return paths


def class_dataset(root: Path, classes: dict[str, int]) -> Path:
    """``train/`` and ``val/`` with ``classes[name]`` images in each class folder (distinct pixels throughout)."""
    start = 0
    for split in ("train", "val"):
        for name, count in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            write_images(root / split / name, count, start=start)
            start += count
    return root


def folder_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, FolderWalkWarning)]


# --- 1. bounded walks -----------------------------------------------------------------------------------------


def test_a_self_loop_in_a_class_folder_counts_each_image_once_with_one_named_warning(tmp_path):
    root = class_dataset(tmp_path / "cls", {"book": 3, "cup": 2})
    (root / "train" / "book" / "loop").symlink_to(".")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = split_samples(root / "train", ["book", "cup"])
    assert sorted(p.name for p, c in samples if c == 0) == ["000.png", "001.png", "002.png"]  # before: 3 x 41
    assert [p.parent.name for p, c in samples if c == 0] == ["book"] * 3
    (message,) = folder_warnings(caught)
    assert "1 folder link(s) not followed" in message and "book/loop" in message


def test_two_loops_and_a_link_to_the_split_end_at_once(tmp_path):
    """``loop -> .`` and ``loop2 -> ../book`` grew without bound under ``os.walk(followlinks=True)``; ``up -> ..``
    would have counted the other class's images in this one."""
    root = class_dataset(tmp_path / "cls", {"book": 3, "cup": 2})
    book = root / "train" / "book"
    (book / "loop").symlink_to(".")
    (book / "loop2").symlink_to("../book")
    (book / "up").symlink_to("..")
    (book / "sub").mkdir()
    (book / "sub" / "back").symlink_to("../..")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = split_samples(root / "train", ["book", "cup"])
        counted = check_classify_dataset(root, tmp_path / "check")
    assert [(p.parent.name, c) for p, c in samples] == [("book", 0)] * 3 + [("cup", 1)] * 2
    assert counted.images["train"].tolist() == [3, 2]
    messages = folder_warnings(caught)
    assert len(messages) == 2  # split_samples, then the check's own walk of train/
    assert messages[0] == (f"{root / 'train'}: 4 folder link(s) not followed, each leading to a folder listed "
                           "already (a loop or a second path): book/loop -> book, book/loop2 -> book, book/up -> . "
                           "(+1 more)")


def test_a_link_never_takes_images_from_their_real_class(tmp_path):
    root = class_dataset(tmp_path / "cls", {"ant": 1, "bee": 2})
    (root / "train" / "ant" / "bees").symlink_to("../bee")  # sorts first, yet bee's images stay bee's
    (root / "train" / "ant" / "same.png").symlink_to("../bee/002.png")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = split_samples(root / "train", ["ant", "bee"])
    assert [(p.relative_to(root / "train").as_posix(), c) for p, c in samples] == [
        ("ant/000.png", 0), ("bee/001.png", 1), ("bee/002.png", 1)]
    (message,) = folder_warnings(caught)
    assert "1 second path(s) to files" in message and "ant/same.png" in message


def test_a_real_folder_is_listed_at_its_own_path_before_a_link_to_it(tmp_path):
    write_images(tmp_path / "r" / "b" / "sub", 1)
    (tmp_path / "r" / "a").mkdir()
    (tmp_path / "r" / "a" / "link").symlink_to("../b/sub")  # found before b/sub is, listed after it
    walk = walk_folders([tmp_path / "r"], frozenset({"png"}))
    assert walk.files == [[tmp_path / "r" / "b" / "sub" / "000.png"]]
    assert walk.repeated_folders == [(tmp_path / "r" / "a" / "link", tmp_path / "r" / "b" / "sub")]


def test_walks_follow_links_to_other_folders_once(tmp_path):
    extra = write_images(tmp_path / "elsewhere", 2, start=10)
    images = tmp_path / "data" / "images" / "train"
    write_images(images, 2)
    (images / "more").symlink_to(tmp_path / "elsewhere")
    (images / "more_again").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "loop").symlink_to(".")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = list_images(images)
    assert [f.name for f in files] == ["000.png", "001.png", *(p.name for p in extra)]
    assert all(f.parent.name in ("train", "more") for f in files)
    (message,) = folder_warnings(caught)
    assert "2 folder link(s) not followed" in message and "more_again" in message


def test_a_list_naming_one_image_twice_or_itself_counts_it_once(tmp_path):
    root = tmp_path / "data"
    write_images(root / "images" / "train", 3)
    (root / "images" / "train" / "alias.png").symlink_to("000.png")
    (root / "train.txt").write_text("./images/train/000.png\nimages/train/000.png\nimages/train/alias.png\n"
                                    "images/train/001.png\ntrain.txt\nimages/train\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = list_images("train.txt", root)
    assert [f.relative_to(root).as_posix() for f in files] == ["images/train/000.png", "images/train/001.png"]
    messages = folder_warnings(caught)
    assert len(messages) == 2
    assert "2 line(s) not naming an image" in messages[0] and "train.txt (this list itself)" in messages[0]
    assert "1 second path(s)" in messages[1] and "alias.png" in messages[1]


def test_walk_folders_lists_each_real_file_once_in_folder_order(tmp_path):
    write_images(tmp_path / "a", 2)
    write_images(tmp_path / "a" / "deeper", 1, start=5)
    (tmp_path / "a" / "deeper" / "top").symlink_to("../..")
    (tmp_path / "a" / "broken.png").symlink_to("absent.png")
    walk = walk_folders([tmp_path / "a"], frozenset({"png"}))
    assert [p.relative_to(tmp_path).as_posix() for p in walk.files[0]] == ["a/000.png", "a/001.png", "a/deeper/005.png"]
    with_broken = walk_folders([tmp_path / "a"], frozenset({"png"}), broken_links=True)
    assert tmp_path / "a" / "broken.png" in with_broken.files[0]
    assert [(str(p.relative_to(tmp_path)), str(q)) for p, q in walk.repeated_folders] == [
        ("a/deeper/top", str(tmp_path))]


def test_a_recursive_glob_in_predict_ends_on_a_loop(tmp_path):
    folder = tmp_path / "pics"
    write_images(folder / "sub", 2)
    (folder / "sub" / "loop").symlink_to(".")
    (folder / ".hidden").mkdir()
    write_images(folder / ".hidden", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = expand_sources(str(folder / "**" / "*.png"))
    assert found == [folder / "sub" / "000.png", folder / "sub" / "001.png"]  # before: 2 x 40, loop/loop/...
    (message,) = folder_warnings(caught)
    assert "sub/loop" in message


# --- 2. images of every size ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("h", "w"), EXTREME_SHAPES)
@pytest.mark.parametrize("target", [64, 320, 640])
def test_letterbox_keeps_at_least_a_pixel_a_side(h, w, target):
    _, resized, pad = letterbox_geometry(np.array([w, h]), np.array([target, target]))
    assert (resized >= 1).all() and (resized <= target).all() and (pad >= 0).all()
    boxed, _, _ = letterbox(np.full((h, w, 3), 200, np.uint8), target)
    assert boxed.shape == (target, target, 3) and (boxed == 200).any()


@pytest.fixture(scope="module")
def extreme_images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("extreme")
    for h, w in EXTREME_SHAPES:
        grid = np.indices((h, w)).sum(0) % 256
        cv2.imwrite(str(folder / f"{h}x{w}.png"), np.stack([grid] * 3, -1).astype(np.uint8))
    return folder


def predicted_shapes(results) -> list[tuple[int, int]]:
    return sorted(tuple(r.orig_shape) for r in results)


def check_segmentation_rows(results, labels: Path) -> None:
    """Every detection has a row of at least 3 points (``class x1 y1 ... score``), normalised to the image."""
    for result in results:
        rows = (labels / f"{Path(result.path).stem}.txt").read_text().splitlines()
        assert len(rows) == len(result.scores)
        for row in rows:
            values = [float(v) for v in row.split()]
            assert len(values) >= 8 and (len(values) - 2) % 2 == 0
            assert all(0 <= v <= 1 for v in values[1:-1])


@pytest.mark.parametrize("task", ["detect", "segment"])
def test_predict_takes_images_of_any_size(task, extreme_images, tmp_path):
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["a", "b"], task=task).eval()
    for size, retina in ((320, False), (64, True)):
        out = tmp_path / f"{size}"
        # A randomly initialised head scores about 0.001 at the finest levels (the reference's objectness
        # prior): a threshold far below it gives every image its detections whatever kernel sums the convs.
        results = predict(model, extreme_images, img_size=size, conf=1e-6, max_det=5, device="cpu",
                          save_dir=out, save_txt=True, save_crop=True, retina_masks=retina)
        assert predicted_shapes(results) == sorted(EXTREME_SHAPES)  # before: an OpenCV assertion at 320
        assert all(len(r.scores) for r in results)
        if task == "segment":
            check_segmentation_rows(results, out / "labels")
            assert all(r.masks.shape[1:] == r.orig_shape for r in results)


def test_a_classifier_predicts_images_of_any_size(extreme_images, tmp_path):
    torch.manual_seed(0)
    model = Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]).eval()
    results = predict(model, extreme_images, img_size=64, device="cpu", save_dir=tmp_path / "out", save_txt=True)
    assert predicted_shapes(results) == sorted(EXTREME_SHAPES)


def test_an_onnx_detector_predicts_images_of_any_size(extreme_images, tmp_path):
    pytest.importorskip("onnxruntime")
    from yolotrain.interop import export

    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2, names=["a", "b"]).eval()
    path = export(model, "onnx", out=tmp_path / "tiny.onnx", img_size=320, simplify=False)
    results = predict(path, extreme_images, img_size=320, conf=0.001, max_det=5, device="cpu")
    assert predicted_shapes(results) == sorted(EXTREME_SHAPES)


# --- 3. a segmentation row for every detection -----------------------------------------------------------------


def test_masks_too_small_for_an_outline_get_their_boxes_corners():
    masks = np.zeros((4, 8, 8), bool)
    masks[1, 3, 3] = True  # one pixel: a 1-point contour
    masks[2, 2, 1:6] = True  # one line: a 2-point contour
    masks[3, 2:6, 2:6] = True  # an area: its own outline
    boxes = torch.tensor([[0.0, 0, 4, 4], [3, 3, 4, 4], [1, 2, 6, 3], [2, 2, 6, 6]])
    polygons = polygons_or_boxes(masks_to_polygons(masks), boxes)
    assert [len(p) for p in polygons] == [4, 4, 4, 4]
    assert polygons[0].tolist() == [[0, 0], [4, 0], [4, 4], [0, 4]]
    assert polygons[2].tolist() == [[1, 2], [6, 2], [6, 3], [1, 3]]
    assert polygons[3].tolist() == masks_to_polygons(masks[3:])[0].tolist()
    det = torch.cat((boxes, torch.tensor([[0.9, 1], [0.8, 0], [0.7, 1], [0.6, 0]])), 1)
    rows = polygon_rows(det, masks_to_polygons(masks), (8, 8), True).splitlines()  # val --save-txt
    assert len(rows) == 4 and all(len(r.split()) == 10 for r in rows)
    assert rows[0] == "1 0 0 0.5 0 0.5 0.5 0 0.5 0.9"


# --- 4. class folders --------------------------------------------------------------------------------------------


def test_an_empty_class_folder_is_refused_by_name_and_named_by_the_check(tmp_path):
    root = class_dataset(tmp_path / "cls", {"ant": 2, "bee": 2})
    (root / "train" / "cow").mkdir()
    (root / "val" / "cow").mkdir()
    write_images(root / "val" / "cow", 1, start=50)
    with pytest.raises(ValueError, match=r"train: 1 class folder\(s\) without an image: cow") as error:
        build_classify_loaders(root, 32, 2, workers=0)
    assert "\n" not in str(error.value)
    with pytest.warns(DataWarning, match=r"train: 1 class folder\(s\) without an image: cow"):
        checked = check_classify_dataset(root, tmp_path / "check")
    assert checked.images["train"].tolist() == [2, 2, 0]


def test_a_one_class_dataset_is_refused_in_one_line(tmp_path):
    root = class_dataset(tmp_path / "cls", {"ant": 3})
    with pytest.raises(ValueError, match="one class folder \\(ant\\): a classifier needs at least 2 classes"):
        build_classify_loaders(root, 32, 2, workers=0)


def test_a_detection_dataset_given_to_a_classifier_says_so(tmp_path):
    root = tmp_path / "det"
    write_images(root / "images" / "train", 2)
    (root / "labels" / "train").mkdir(parents=True)
    data = root / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/train",
                                    "names": ["a", "b"]}))
    for path in (data, root):
        with pytest.raises(ValueError, match=r"is a (dataset YAML of a )?detection dataset.*: a classifier needs a "
                           "folder of class folders"):
            resolve_classify_source(path)
    split_style = tmp_path / "roboflow"
    write_images(split_style / "train" / "images", 2)
    (split_style / "train" / "labels").mkdir()
    with pytest.raises(ValueError, match="is a detection dataset"):
        build_classify_loaders(split_style, 32, 2, workers=0)
    assert not os.path.exists(tmp_path / "det" / "train.yolotrain.cache")


def test_training_a_classifier_on_a_detection_yaml_names_it(tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "images", "names": ["a", "b"]}))
    trainer = Trainer(resolve_config(data=str(data), model="yolov5n-cls", epochs=1, project=str(tmp_path / "runs"),
                                     img_size=64, batch_size=2, workers=0))
    with pytest.raises(ConfigError, match=r"must be a folder of class folders .*, a dataset YAML of a detection"):
        trainer.setup()
