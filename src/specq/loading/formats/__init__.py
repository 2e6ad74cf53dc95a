"""Model files as specq reads and writes them: Hugging Face folders (`hf.py`), GGUF files (a header
in well under a second: `gguf_reader.py`; config, tensors and tokenizer: `gguf_io.py`; a file as a
`Model`: `gguf_load.py`), files shipped in parts by pip packages (`packaged.py`), a folder's checks
before any weight loads (`validate.py`), and specq's own folders (`save.py`)."""
