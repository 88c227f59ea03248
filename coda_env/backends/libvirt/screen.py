"""Observation: `virDomainScreenshot` (a PNG or PPM stream from QEMU's screendump), decoded with Pillow."""

from __future__ import annotations

from io import BytesIO

import numpy as np

from ..base import DesktopError


def decode_screenshot(data: bytes, size: tuple[int, int], resize: bool = True) -> np.ndarray:
    """A PNG/PPM screenshot as an (H, W, 3) uint8 RGB array of exactly `size` = (width, height)."""
    from PIL import Image

    try:
        img = Image.open(BytesIO(data))
        img.load()
    except Exception as e:
        raise DesktopError(f"cannot decode the VM screenshot ({len(data)} bytes): {e}") from None
    if img.mode != "RGB":
        img = img.convert("RGB")
    if img.size != tuple(size):
        if not resize:
            raise DesktopError(
                f"the VM screen is {img.size[0]}x{img.size[1]}, not the configured "
                f"{size[0]}x{size[1]}: set the guest's resolution (the domain XML's video "
                f"<resolution>, xrandr in the image) or pass resize=True"
            )
        img = img.resize(tuple(size), Image.BILINEAR)
    return np.asarray(img, dtype=np.uint8).copy()


class ScreenMixin:
    """`LibvirtDesktop`'s screenshots."""

    def screenshot(self) -> np.ndarray:
        self._check()
        lv = self._lv
        chunks: list[bytes] = []
        try:
            stream = self._conn.newStream(0)
            self._dom.screenshot(stream, 0, 0)
            stream.recvAll(lambda _s, data, acc: acc.append(bytes(data)) or 0, chunks)
            stream.finish()
        except lv.libvirtError as e:
            raise DesktopError(f"screenshot of {self.name} failed: {e}") from None
        return decode_screenshot(b"".join(chunks), (self.width, self.height), self.config.resize)
