//! A minimal line plot written as a PNG, without a plotting dependency: axes, grid lines and
//! one polyline per series. Labels are left to the document that shows the image. The PNG is
//! encoded with stored (uncompressed) deflate blocks: bigger files, no compression crate.

/// RGB colour.
pub type Rgb = [u8; 3];

/// One series: colour and (x, y) points in data units.
#[derive(Clone, Debug)]
pub struct Series {
    pub color: Rgb,
    pub points: Vec<(f64, f64)>,
}

/// An RGB raster.
#[derive(Clone, Debug)]
pub struct Canvas {
    pub width: u32,
    pub height: u32,
    pixels: Vec<u8>,
}

impl Canvas {
    pub fn new(width: u32, height: u32, background: Rgb) -> Self {
        let mut pixels = Vec::with_capacity((width * height * 3) as usize);
        for _ in 0..width * height {
            pixels.extend_from_slice(&background);
        }
        Self {
            width,
            height,
            pixels,
        }
    }

    pub fn get(&self, x: u32, y: u32) -> Rgb {
        let i = ((y * self.width + x) * 3) as usize;
        [self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]]
    }

    pub fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x < 0 || y < 0 || x >= i64::from(self.width) || y >= i64::from(self.height) {
            return;
        }
        let i = ((y as u32 * self.width + x as u32) * 3) as usize;
        self.pixels[i..i + 3].copy_from_slice(&c);
    }

    /// Bresenham, 2 px thick.
    pub fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: Rgb) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, c);
            self.set(x + 1, y, c);
            self.set(x, y + 1, c);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// The image as a PNG file.
    pub fn to_png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(self.pixels.len() + self.height as usize);
        for row in self.pixels.chunks(self.width as usize * 3) {
            raw.push(0); // filter: none
            raw.extend_from_slice(row);
        }
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&self.width.to_be_bytes());
        ihdr.extend_from_slice(&self.height.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        chunk(&mut out, b"IHDR", &ihdr);
        chunk(&mut out, b"IDAT", &zlib_stored(&raw));
        chunk(&mut out, b"IEND", &[]);
        out
    }
}

/// Plot margins in pixels (left, right, top, bottom).
const MARGIN: (u32, u32, u32, u32) = (50, 20, 20, 40);

/// Plot `series` on a white canvas; axes from 0 to the largest x and y. Grid lines every tenth.
pub fn plot(width: u32, height: u32, series: &[Series]) -> Canvas {
    let mut c = Canvas::new(width, height, [255, 255, 255]);
    let (l, r, t, b) = MARGIN;
    let (x0, y0) = (i64::from(l), i64::from(height - b));
    let (x1, y1) = (i64::from(width - r), i64::from(t));
    let max_x = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1e-9);
    let max_y = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1e-9);
    for i in 1..=10 {
        let gx = x0 + (x1 - x0) * i / 10;
        let gy = y0 + (y1 - y0) * i / 10;
        c.line((gx, y0), (gx, y1), [225, 225, 225]);
        c.line((x0, gy), (x1, gy), [225, 225, 225]);
    }
    c.line((x0, y0), (x1, y0), [0, 0, 0]);
    c.line((x0, y0), (x0, y1), [0, 0, 0]);
    let to_px = |(x, y): (f64, f64)| {
        (
            x0 + ((x / max_x) * (x1 - x0) as f64).round() as i64,
            y0 + ((y / max_y) * (y1 - y0) as f64).round() as i64,
        )
    };
    for s in series {
        for w in s.points.windows(2) {
            c.line(to_px(w[0]), to_px(w[1]), s.color);
        }
    }
    c
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in data {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// A zlib stream of stored deflate blocks (at most 65,535 bytes each).
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = if data.is_empty() {
        vec![&[]]
    } else {
        data.chunks(65_535).collect()
    };
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_and_adler_match_known_values() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
    }

    #[test]
    fn png_has_signature_header_and_end() {
        let png = Canvas::new(3, 2, [1, 2, 3]).to_png();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 3);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 2);
        assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
    }

    #[test]
    fn stored_blocks_split_large_images() {
        let data = vec![7u8; 70_000];
        let z = zlib_stored(&data);
        // header + two blocks of (1 + 4) bytes framing + data + adler
        assert_eq!(z.len(), 2 + 2 * 5 + 70_000 + 4);
        assert_eq!(z[2], 0, "first block is not final");
        assert_eq!(z[2 + 5 + 65_535], 1, "second block is final");
    }

    #[test]
    fn a_series_is_drawn_in_its_colour() {
        let red = [255, 0, 0];
        let c = plot(
            200,
            100,
            &[Series {
                color: red,
                points: vec![(0.0, 10.0), (10.0, 0.0)],
            }],
        );
        // The line starts at the top-left corner of the plot area.
        let (l, _, t, _) = MARGIN;
        assert_eq!(c.get(l, t), red);
        assert_eq!(c.get(199, 0), [255, 255, 255]);
    }
}
