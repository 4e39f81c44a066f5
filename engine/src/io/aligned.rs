//! A heap buffer aligned to [`DIRECT_ALIGNMENT`], for `O_DIRECT` writes: the kernel transfers
//! straight from it, so its address must be aligned as well as the file position and length.

use super::DIRECT_ALIGNMENT;
use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ptr::NonNull;

/// An owned, aligned, non-empty byte buffer.
pub(crate) struct AlignedBuffer {
    pointer: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory, like a `Vec<u8>`.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// A copy of `bytes`, which must not be empty.
    pub fn copy_of(bytes: &[u8]) -> AlignedBuffer {
        assert!(!bytes.is_empty(), "an aligned buffer is never empty");
        let layout = Layout::from_size_align(bytes.len(), DIRECT_ALIGNMENT)
            .expect("a buffer's length fits a layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc(layout) };
        let Some(pointer) = NonNull::new(raw) else { handle_alloc_error(layout) };
        // SAFETY: `pointer` is valid for `bytes.len()` bytes and does not overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), pointer.as_ptr(), bytes.len()) };
        AlignedBuffer { pointer, layout }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation holds `layout.size()` initialised bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `copy_of` with this very layout.
        unsafe { dealloc(self.pointer.as_ptr(), self.layout) };
    }
}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuffer").field("length", &self.layout.size()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_aligns() {
        for length in [1, 4096, 3 * 4096 + 17] {
            let bytes: Vec<u8> = (0..length).map(|i: u32| (i % 251) as u8).collect();
            let buffer = AlignedBuffer::copy_of(&bytes);
            assert_eq!(buffer.as_slice().as_ptr() as usize % DIRECT_ALIGNMENT, 0);
            assert_eq!(buffer.as_slice(), &bytes[..]);
        }
    }
}
