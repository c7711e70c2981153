"""Videos in decisions: containers checked and frames sampled with PyAV (FFmpeg), read by the image models served.

- `clips`: a request's `videos` entry (a `data:video/*;base64,` URL) as bytes;
- `container`: what the container says (format, video stream, frame size, length) and the frames at given times,
  decoded one at a time (never a whole video in memory);
- `moments`: the times a `box` with `at` or a `track` question reads, and the per-request frame budget;
- `tracking`: from each sampled frame's OCR text lines to a box, its confidence and whether the target is visible.
"""
