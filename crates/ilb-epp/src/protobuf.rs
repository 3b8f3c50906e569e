//! The fields of an encoded protobuf message, walked where they lie: the EPP reads Envoy's header
//! maps and the gateway's metadata this way instead of decoding them into owned messages. The
//! ext_proc fuzz target runs every message through it.

/// The fields of an encoded protobuf message, in order: the tag and, for a length-delimited
/// field, its bytes (`None` for the other wire types, which are skipped).
pub(crate) struct Fields<'a>(pub(crate) &'a [u8]);

/// A field's tag and, if length-delimited, its bytes.
pub(crate) type Field<'a> = (u64, Option<&'a [u8]>);

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, &'static str> {
        // Most varints here (tags, short lengths) are one byte.
        if let Some((&byte, rest)) = self.0.split_first() {
            if byte < 0x80 {
                self.0 = rest;
                return Ok(u64::from(byte));
            }
        }
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.0.split_first().ok_or("truncated varint")?;
            self.0 = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err("varint too long")
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], &'static str> {
        let len = usize::try_from(len).map_err(|_| "length too large")?;
        if len > self.0.len() {
            return Err("truncated field");
        }
        let (field, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(field)
    }

    #[inline]
    pub(crate) fn next_field(&mut self) -> Result<Option<Field<'a>>, &'static str> {
        // Most fields read here (a header, its key and value, a metadata key) are
        // length-delimited with a one-byte tag and a one-byte length.
        if let [key, len, rest @ ..] = self.0 {
            let (key, len) = (*key, usize::from(*len));
            if key & 0x87 == 2 && key >= 8 && len < 0x80 && len <= rest.len() {
                let (field, rest) = rest.split_at(len);
                self.0 = rest;
                return Ok(Some((u64::from(key >> 3), Some(field))));
            }
        }
        self.any_field()
    }

    /// [`Fields::next_field`] for any field.
    #[inline(never)]
    fn any_field(&mut self) -> Result<Option<Field<'a>>, &'static str> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => {
                self.varint()?;
                None
            }
            1 => {
                self.take(8)?;
                None
            }
            2 => {
                let len = self.varint()?;
                Some(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                None
            }
            _ => return Err("unsupported wire type"),
        };
        if key >> 3 == 0 {
            return Err("field number 0");
        }
        Ok(Some((key >> 3, field)))
    }
}
