//! The protobuf codec of `inference.v1` calls: tonic's prost codec with
//! small initial buffers.
//!
//! tonic starts every call with an 8 KiB encode and an 8 KiB decode buffer
//! and keeps them for the call's life. A generation is a long-lived stream
//! of token events of a few dozen bytes each, and a gateway holds thousands
//! of them open, so those buffers dominated its memory per idle stream.
//! Buffers still grow to fit any message.

use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::ProstCodec;

/// Initial encode and decode buffer of a call.
const INITIAL_BUFFER_BYTES: usize = 256;
/// tonic's default: yield to the runtime after encoding this much.
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(INITIAL_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

/// [`ProstCodec`] with [`INITIAL_BUFFER_BYTES`] buffers.
#[derive(Debug, Clone, Copy)]
pub struct CompactCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for CompactCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for CompactCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
