//! Screenshots of a sandbox's display: `xwd -root` inside the sandbox,
//! decoded, scaled and encoded as PNG here, in-process (no converter
//! program), and the scaling between the screen and what the model sees.

use fast_image_resize as fr;

/// An RGB image, 3 bytes a pixel, rows top to bottom.
#[derive(Debug, Clone, PartialEq)]
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// Decodes an XWD dump (`xwd -root -silent`) of a TrueColor screen.
pub fn decode_xwd(data: &[u8]) -> Result<Rgb, String> {
    let field = |i: usize| -> Result<u32, String> {
        data.get(i * 4..i * 4 + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| "the screenshot is cut short".to_string())
    };
    let header_size = field(0)? as usize;
    if field(1)? != 7 {
        return Err(format!(
            "not an XWD (version 7) dump: version {}",
            field(1)?
        ));
    }
    if field(2)? != 2 {
        return Err("the screenshot is not in ZPixmap format".into());
    }
    let (width, height) = (field(4)?, field(5)?);
    let byte_order = field(7)?; // 0: least significant byte first
    let bits_per_pixel = field(11)?;
    let bytes_per_line = field(12)? as usize;
    let (red, green, blue) = (field(14)?, field(15)?, field(16)?);
    let ncolors = field(19)? as usize;
    if bits_per_pixel != 32 && bits_per_pixel != 24 {
        return Err(format!(
            "screens of {bits_per_pixel} bits a pixel are not supported (24 or 32)"
        ));
    }
    let start = header_size + ncolors * 12;
    let size = bytes_per_line
        .checked_mul(height as usize)
        .ok_or("the screenshot's size overflows")?;
    let body = data
        .get(start..start + size)
        .ok_or("the screenshot is cut short")?;
    let step = (bits_per_pixel / 8) as usize;
    let channel = |pixel: u32, mask: u32| -> u8 {
        if mask == 0 {
            return 0;
        }
        let v = (pixel & mask) >> mask.trailing_zeros();
        let bits = (mask >> mask.trailing_zeros()).count_ones();
        // Scaled to 8 bits whatever the mask's width.
        ((v * 255) / ((1u32 << bits) - 1)) as u8
    };
    let mut pixels = Vec::with_capacity(width as usize * height as usize * 3);
    for row in body.chunks_exact(bytes_per_line) {
        for px in row[..width as usize * step].chunks_exact(step) {
            let mut b = [0u8; 4];
            b[..step].copy_from_slice(px);
            let v = if byte_order == 0 {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b) >> (32 - bits_per_pixel)
            };
            pixels.extend([channel(v, red), channel(v, green), channel(v, blue)]);
        }
    }
    Ok(Rgb {
        width,
        height,
        pixels,
    })
}

/// The size the model works in for a screen: the standard size (XGA,
/// WXGA, FWXGA) of the same aspect ratio that is smaller than the screen,
/// else the screen itself.
pub fn model_size(width: u32, height: u32) -> (u32, u32) {
    const TARGETS: [(u32, u32); 3] = [(1024, 768), (1280, 800), (1366, 768)];
    let ratio = width as f64 / height as f64;
    TARGETS
        .into_iter()
        .find(|&(w, h)| (w as f64 / h as f64 - ratio).abs() < 0.02 && w < width)
        .unwrap_or((width, height))
}

/// Maps between the model's coordinates and the screen's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaling {
    pub screen: (u32, u32),
    pub model: (u32, u32),
}

impl Scaling {
    pub fn for_screen(width: u32, height: u32) -> Scaling {
        Scaling {
            screen: (width, height),
            model: model_size(width, height),
        }
    }

    /// A point the model gave, on the screen; out of bounds is an error
    /// that says what the bounds are.
    pub fn to_screen(&self, x: i64, y: i64) -> Result<(u32, u32), String> {
        let (mw, mh) = self.model;
        if x < 0 || y < 0 || x >= mw as i64 || y >= mh as i64 {
            return Err(format!(
                "({x}, {y}) is off the screen: x must be in 0..{mw} and y in 0..{mh}"
            ));
        }
        let sx = (x as f64 * self.screen.0 as f64 / mw as f64).round() as u32;
        let sy = (y as f64 * self.screen.1 as f64 / mh as f64).round() as u32;
        Ok((sx.min(self.screen.0 - 1), sy.min(self.screen.1 - 1)))
    }

    /// A point on the screen, as the model sees it.
    pub fn to_model(&self, x: u32, y: u32) -> (u32, u32) {
        let (mw, mh) = self.model;
        (
            (x as f64 * mw as f64 / self.screen.0 as f64).round() as u32,
            (y as f64 * mh as f64 / self.screen.1 as f64).round() as u32,
        )
    }
}

/// `img` resized to `width` x `height` (a no-op when it is that size).
pub fn resize(img: &Rgb, width: u32, height: u32) -> Result<Rgb, String> {
    if (img.width, img.height) == (width, height) {
        return Ok(img.clone());
    }
    let src = fr::images::ImageRef::new(img.width, img.height, &img.pixels, fr::PixelType::U8x3)
        .map_err(|e| format!("cannot scale the screenshot: {e}"))?;
    let mut dst = fr::images::Image::new(width, height, fr::PixelType::U8x3);
    let options =
        fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear));
    fr::Resizer::new()
        .resize(&src, &mut dst, &options)
        .map_err(|e| format!("cannot scale the screenshot: {e}"))?;
    Ok(Rgb {
        width,
        height,
        pixels: dst.into_vec(),
    })
}

/// The part of `img` from (x0, y0) to (x1, y1), exclusive.
pub fn crop(img: &Rgb, x0: u32, y0: u32, x1: u32, y1: u32) -> Rgb {
    let (x1, y1) = (x1.min(img.width), y1.min(img.height));
    let mut pixels = Vec::with_capacity(((x1 - x0) * (y1 - y0) * 3) as usize);
    for y in y0..y1 {
        let row = (y * img.width * 3) as usize;
        pixels.extend_from_slice(&img.pixels[row + x0 as usize * 3..row + x1 as usize * 3]);
    }
    Rgb {
        width: x1 - x0,
        height: y1 - y0,
        pixels,
    }
}

/// `img` as a PNG file.
pub fn png(img: &Rgb) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, img.width, img.height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    // Measured on a desktop of three X apps: as fast as `Fast` (the
    // capture dominates) and a third smaller.
    enc.set_compression(png::Compression::Balanced);
    let mut w = enc
        .write_header()
        .map_err(|e| format!("cannot encode the screenshot: {e}"))?;
    w.write_image_data(&img.pixels)
        .map_err(|e| format!("cannot encode the screenshot: {e}"))?;
    w.finish()
        .map_err(|e| format!("cannot encode the screenshot: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x2 XWD dump, 32 bits a pixel, LSB first, like Xvfb's.
    fn xwd(pixels: &[u32], width: u32, height: u32) -> Vec<u8> {
        let name = b"root\0";
        let header_size = 100 + name.len() as u32;
        let fields: [u32; 25] = [
            header_size,
            7,
            2,
            24,
            width,
            height,
            0,
            0,
            32,
            0,
            32,
            32,
            width * 4,
            4,
            0xff0000,
            0xff00,
            0xff,
            8,
            256,
            0,
            width,
            height,
            0,
            0,
            0,
        ];
        let mut d: Vec<u8> = fields.iter().flat_map(|f| f.to_be_bytes()).collect();
        d.extend_from_slice(name);
        for p in pixels {
            d.extend_from_slice(&p.to_le_bytes());
        }
        d
    }

    #[test]
    fn xwd_pixels_come_out_as_rgb() {
        let data = xwd(&[0xff0000, 0x00ff00, 0x0000ff, 0xffffff, 0, 0x102030], 3, 2);
        let img = decode_xwd(&data).unwrap();
        assert_eq!((img.width, img.height), (3, 2));
        assert_eq!(&img.pixels[..9], &[255, 0, 0, 0, 255, 0, 0, 0, 255]);
        assert_eq!(
            &img.pixels[9..],
            &[255, 255, 255, 0, 0, 0, 0x10, 0x20, 0x30]
        );
        assert!(decode_xwd(&data[..data.len() - 1]).is_err());
        assert!(decode_xwd(b"nonsense").is_err());
    }

    #[test]
    fn sizes_follow_the_aspect_ratio_and_points_map_both_ways() {
        assert_eq!(model_size(1280, 960), (1024, 768));
        assert_eq!(model_size(1920, 1200), (1280, 800));
        assert_eq!(model_size(1920, 1080), (1366, 768));
        // Already small, or an odd ratio: as it is.
        assert_eq!(model_size(1024, 768), (1024, 768));
        assert_eq!(model_size(1000, 1000), (1000, 1000));
        let s = Scaling::for_screen(2048, 1536);
        assert_eq!(s.to_screen(512, 384).unwrap(), (1024, 768));
        assert_eq!(s.to_model(1024, 768), (512, 384));
        assert_eq!(s.to_screen(1023, 767).unwrap(), (2046, 1534));
        let e = s.to_screen(1024, 10).unwrap_err();
        assert!(e.contains("x must be in 0..1024"), "{e}");
        assert!(s.to_screen(-1, 0).is_err());
    }

    #[test]
    fn scaled_crops_encode_as_png() {
        let img = Rgb {
            width: 4,
            height: 4,
            pixels: (0..48).map(|i| (i * 5) as u8).collect(),
        };
        let c = crop(&img, 1, 1, 3, 3);
        assert_eq!((c.width, c.height), (2, 2));
        assert_eq!(&c.pixels[..3], &img.pixels[15..18]);
        let small = resize(&img, 2, 2).unwrap();
        assert_eq!(small.pixels.len(), 12);
        let bytes = png(&small).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }
}
