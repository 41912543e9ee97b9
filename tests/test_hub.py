"""Official weights by name, against a local HTTP server serving the shipped yolov5n.pt (never the internet)."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
from pathlib import Path

import pytest
from conftest import YOLOV5N_WEIGHTS

from yolotrain.cli import main
from yolotrain.interop import load_checkpoint, load_model
from yolotrain.interop.loading import hub


class _Handler(http.server.BaseHTTPRequestHandler):
    """Routes: /good/yolov5n.pt the file; /short/ a body cut half-way under the full Content-Length;
    /wrong/ a complete response whose content has one byte changed; /renamed/NAME the file under any
    official name; anything else 404."""

    payload = b""
    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        type(self).requests.append(self.path)
        data = self.payload
        if self.path == "/good/yolov5n.pt":
            body = data
        elif self.path == "/short/yolov5n.pt":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        elif self.path == "/wrong/yolov5n.pt":
            body = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        elif self.path.startswith("/renamed/"):
            body = data
        else:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    _Handler.payload = YOLOV5N_WEIGHTS.read_bytes()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def weights_home(tmp_path, monkeypatch):
    folder = tmp_path / "weights"
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS", str(folder))
    monkeypatch.chdir(tmp_path)  # no yolov5n.pt in the working folder
    return folder


def test_the_table_hash_is_the_shipped_file():
    if not YOLOV5N_WEIGHTS.is_file():
        pytest.skip(f"official weights not found at {YOLOV5N_WEIGHTS}")
    assert hashlib.sha256(YOLOV5N_WEIGHTS.read_bytes()).hexdigest() == hub.SHA256["yolov5n.pt"]


def test_download_verifies_stores_atomically_and_is_reused(server, weights_home, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", f"{server}/good")
    _Handler.requests.clear()
    model = load_model("yolov5n.pt")
    stored = weights_home / "yolov5n.pt"
    assert stored.read_bytes() == YOLOV5N_WEIGHTS.read_bytes()
    assert [p.name for p in weights_home.iterdir()] == ["yolov5n.pt"]  # no temporary file left
    assert model.version == "n" and model.num_classes == 80
    # Second use: the stored copy, no request.
    assert hub.resolve_weights("yolov5n.pt") == stored
    load_model("yolov5n.pt")
    assert _Handler.requests == ["/good/yolov5n.pt"]


@pytest.mark.parametrize(("route", "expected"), [
    ("short", "incomplete"),
    ("wrong", "SHA-256 mismatch"),
    ("missing", "HTTP 404"),
])
def test_bad_downloads_keep_nothing_and_say_where_to_put_the_file(server, weights_home, monkeypatch, route,
                                                                   expected):
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", f"{server}/{route}")
    with pytest.raises(hub.WeightsUnavailableError) as error:
        hub.resolve_weights("yolov5n.pt")
    message = str(error.value)
    assert expected in message and "\n" not in message
    assert f"{server}/{route}/yolov5n.pt" in message and str(weights_home) in message
    assert not weights_home.exists() or not any(weights_home.iterdir())


def test_offline_is_one_line_from_the_command_line(weights_home, monkeypatch, capsys):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", f"http://127.0.0.1:{port}")
    assert main(["export", "--weights", "yolov5n.pt", "--format", "torchscript"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cannot reach" in err and f"127.0.0.1:{port}/yolov5n.pt" in err and str(weights_home) in err


def test_an_asset_without_a_known_hash_is_never_downloaded(server, weights_home, monkeypatch, capsys):
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", f"{server}/good")
    monkeypatch.delitem(hub.SHA256, "yolov5s.pt")
    _Handler.requests.clear()
    assert main(["export", "--weights", "yolov5s.pt", "--format", "torchscript"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no verified SHA-256" in err and f"{server}/good/yolov5s.pt" in err and str(weights_home) in err
    assert _Handler.requests == []


def test_every_official_name_is_checked_against_its_own_hash(server, weights_home, monkeypatch):
    """P5 and P6 names all have a hash (the segmentation models none: they are never downloaded), and it is
    the asset's own: yolov5n.pt served as another name is refused and not kept."""
    assert set(hub.SHA256) == {name for name in hub.OFFICIAL_WEIGHTS if not name.endswith("-seg.pt")}
    assert len(set(hub.SHA256.values())) == len(hub.SHA256)
    assert all(len(h) == 64 and set(h) <= set("0123456789abcdef") for h in hub.SHA256.values())
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", f"{server}/renamed")
    for name in ("yolov5s.pt", "yolov5x6.pt"):
        with pytest.raises(hub.WeightsUnavailableError, match="SHA-256 mismatch"):
            hub.resolve_weights(name)
    assert not weights_home.exists() or not any(weights_home.iterdir())


def test_local_files_win_and_other_names_pass_through(tmp_path, weights_home, monkeypatch):
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", "http://127.0.0.1:9")  # would fail if contacted
    own = tmp_path / "yolov5s.pt"
    own.write_bytes(b"x")
    assert hub.resolve_weights("yolov5s.pt") == Path("yolov5s.pt")  # the working folder's file
    own.unlink()
    weights_home.mkdir()
    (weights_home / "yolov5s.pt").write_bytes(b"x")
    assert hub.resolve_weights("yolov5s.pt") == weights_home / "yolov5s.pt"
    assert hub.resolve_weights("runs/best.json") == Path("runs/best.json")
    assert hub.resolve_weights("sub/yolov5n.pt") == Path("sub/yolov5n.pt")  # a path, not a name


def test_default_folder_is_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("YOLOTRAIN_WEIGHTS", raising=False)
    monkeypatch.setenv("YOLOTRAIN_CACHE", str(tmp_path / "cache"))
    assert hub.weights_dir() == tmp_path / "cache" / "weights"


def test_training_fine_tunes_from_weights_fetched_by_name(server, weights_home, monkeypatch, tmp_path):
    from yolotrain import train
    from yolotrain.data import generate_shapes_dataset

    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=4, n_val=2, img_size=64) / "data.yaml"
    monkeypatch.setenv("YOLOTRAIN_WEIGHTS_URL", f"{server}/good")
    run = train(data=str(data), model="yolov5n.pt", epochs=1, img_size=64, batch_size=4, workers=0, val=False,
                plots=False, autoanchor=False, project=str(tmp_path / "runs"))
    assert (weights_home / "yolov5n.pt").is_file()
    model, _ = load_checkpoint(run.last)
    assert model.num_classes == 2  # the official backbone with a new head for the dataset's classes
