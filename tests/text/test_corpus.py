"""The language-model corpus: the standard library split by file, a byte tokenizer, and what gzip and
xz achieve on the validation bytes (the baseline a model must beat)."""

import pytest

from scaleforge.text import ByteTokenizer, CorpusError, compressed_bits_per_byte, in_validation, load_corpus
from scaleforge.text.corpus import EXCLUDED_DIRS


def test_the_stdlib_corpus_is_real_code_split_by_file_the_same_way_every_time():
    corpus = load_corpus()
    files = corpus.train + corpus.validation
    assert len(files) > 500 and corpus.train_bytes + corpus.validation_bytes > 8_000_000  # ~600 files, ~11 MB
    assert all(f.relative.endswith(".py") and not EXCLUDED_DIRS & set(f.relative.split("/")) for f in files)
    assert 0.02 < len(corpus.validation) / len(files) < 0.10  # about 5% of the files
    assert all(in_validation(f.relative, 0.05) for f in corpus.validation)
    assert not {f.relative for f in corpus.train} & {f.relative for f in corpus.validation}
    again = load_corpus()
    assert again == corpus and again.fingerprint() == corpus.fingerprint()
    assert load_corpus(validation_fraction=0.2).validation_bytes > corpus.validation_bytes


def test_compressors_set_the_bar_on_the_validation_bytes():
    data = load_corpus().read("validation")
    gzip, xz = compressed_bits_per_byte(data, "gzip -9"), compressed_bits_per_byte(data, "xz -9e")
    assert 1.0 < xz < gzip < 3.0, (gzip, xz)  # code compresses to ~1.8 (gzip) and ~1.3-1.6 (xz) bits per byte


def test_a_folder_of_the_users_own_text_and_the_errors_that_name_it(tmp_path):
    (tmp_path / "notes").mkdir()
    for i in range(40):
        (tmp_path / "notes" / f"{i}.txt").write_text(f"note {i}: naïve café\n" * 20)
    (tmp_path / "image.bin").write_bytes(bytes(range(256)) * 4)  # not UTF-8: not text
    corpus = load_corpus(str(tmp_path), validation_fraction=0.1)
    assert {f.relative for f in corpus.train + corpus.validation} == {f"notes/{i}.txt" for i in range(40)}
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "image.bin").write_bytes(b"\xff\xfe" * 10)
    with pytest.raises(CorpusError, match=f"corpus folder '{empty}' holds no text files"):
        load_corpus(str(empty))
    with pytest.raises(CorpusError, match="corpus folder '/nonexistent/corpus' does not exist"):
        load_corpus("/nonexistent/corpus")


def test_byte_tokens_round_trip_any_text():
    tokenizer = ByteTokenizer()
    tokens = tokenizer.encode("def naïve(): return '→'\n")
    assert tokens.dtype.name == "uint8" and int(tokens.max()) < tokenizer.vocab_size
    assert tokenizer.decode(tokens) == "def naïve(): return '→'\n"
    assert tokenizer.to_json() == {"type": "bytes", "vocab_size": 256}


def test_a_parquet_column_of_documents_split_by_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    documents = [f"document {i}: naïve café\n" * (i + 1) for i in range(60)] + [""]  # an empty row is skipped
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": list(range(61)), "body": documents}), path)
    corpus = load_corpus(str(path), validation_fraction=0.1, column="body")
    rows = corpus.train + corpus.validation
    assert len(rows) == 60 and corpus.validation and corpus.train
    assert b"".join(sorted(r.read() for r in rows)) == b"".join(sorted(d.encode() for d in documents[:60]))
    assert (
        corpus.fingerprint() == load_corpus(str(path), validation_fraction=0.1, column="body").fingerprint()
    )
    with pytest.raises(
        CorpusError, match=r"has no text column 'text' \(its columns: id, body\); set data.column"
    ):
        load_corpus(str(path))
    with pytest.raises(CorpusError, match="has no text column 'id'"):
        load_corpus(str(path), column="id")
