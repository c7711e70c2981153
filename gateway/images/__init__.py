"""Images: safe decoding (decode.py), per-model preprocessing (preprocess.py), content parts (content.py), running
image models in Triton (run.py), OCR (ocr.py) and the image paths of the embeddings/classify surfaces (surfaces.py).
"""
