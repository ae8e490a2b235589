//! A forward captured once and replayed ([`ReplayedForward`]): on CUDA one graph launch in
//! place of the forward's hundreds of kernel launches and allocations; on the CPU the same
//! calls, run again (the twin that lets the bookkeeping and its callers be tested in CI).
//!
//! Contract: `run` computes the same work from the same device memory on every call: its
//! inputs live in buffers it reads (a replay re-reads whatever they hold then), its kernel
//! arguments do not change, and it copies nothing between host and device. What the host
//! side of `run` does (a KV cache's length, checks) happens at capture only, never at a
//! replay. The output tensor of a replay is the same device memory each time, overwritten by
//! the next replay.
//!
//! How the capture works on CUDA: candle's upload cache is turned on, and `run` is called
//! once eagerly (every kernel module gets loaded, and every small host array `run` uploads,
//! such as layouts and positions, is uploaded once and kept), then once inside a relaxed
//! stream capture (the uploads are then served from the cache, so none reaches the graph);
//! the graph is instantiated to free its own allocations when launched again, so its output
//! keeps one fixed address. A `run` that reads device memory back to the host, or uploads
//! more than candle caches (4 KiB), fails the capture with candle's error naming the copy.

use candle_core::{Device, Result, Tensor};

/// A forward recorded as a graph on CUDA, or nothing on the CPU, where each replay calls the
/// forward instead. It keeps no closure, so the forward may borrow what the caller needs
/// between replays (a KV cache, a step's inputs): the caller hands the same forward to
/// [`Self::replay`], which calls it only on the CPU.
pub struct DeviceGraph {
    #[cfg(feature = "cuda")]
    graph: Option<cuda::Captured>,
}

impl DeviceGraph {
    /// Records `run` on `device` (see the module docs for what `run` may do). On CUDA this
    /// calls `run` twice (a warm-up, then the capture); on the CPU not at all.
    pub fn capture(device: &Device, run: impl FnMut() -> Result<Tensor>) -> Result<Self> {
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => {
                let mut run = run;
                Ok(Self { graph: Some(cuda::Captured::new(dev, &mut run)?) })
            }
            _ => {
                drop(run);
                Ok(Self {
                    #[cfg(feature = "cuda")]
                    graph: None,
                })
            }
        }
    }

    /// The recorded forward again: a graph launch on CUDA (`run` is not called; the output is
    /// queued on the device's stream like any op), `run` itself on the CPU.
    pub fn replay(&mut self, run: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Some(g) = self.graph.as_mut() {
            return g.replay();
        }
        run()
    }

    /// Whether replays are graph launches (CUDA) rather than the calls themselves (CPU).
    pub fn is_graph(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.graph.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }
}

/// A forward recorded for replays with the forward kept inside (see the module docs): for a
/// forward that borrows nothing the caller changes between replays.
pub struct ReplayedForward<'a> {
    graph: DeviceGraph,
    run: Box<dyn FnMut() -> Result<Tensor> + 'a>,
}

impl<'a> ReplayedForward<'a> {
    /// Records `run` on `device` ([`DeviceGraph::capture`]).
    pub fn capture(device: &Device, run: impl FnMut() -> Result<Tensor> + 'a) -> Result<Self> {
        let mut run = Box::new(run);
        let graph = DeviceGraph::capture(device, &mut run)?;
        Ok(Self { graph, run })
    }

    /// Runs the recorded forward again and returns its output ([`DeviceGraph::replay`]).
    pub fn replay(&mut self) -> Result<Tensor> {
        let Self { graph, run } = self;
        graph.replay(run)
    }

    /// Whether replays are graph launches (CUDA) rather than the calls themselves (CPU).
    pub fn is_graph(&self) -> bool {
        self.graph.is_graph()
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{bail, Result, Tensor};

    /// A graph and the output tensor its launches write. Field order matters: the graph is
    /// destroyed before the output's memory (one of the graph's allocations) is freed.
    pub(super) struct Captured {
        graph: CudaGraph,
        output: Tensor,
    }

    /// A capture still open on `stream` (see [`Captured::new`]).
    struct OpenCapture<'s> {
        stream: &'s std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
        open: bool,
    }

    impl Drop for OpenCapture<'_> {
        fn drop(&mut self) {
            if self.open {
                use candle_core::cuda_backend::cudarc::driver::result;
                let _ = self.stream.context().check_err();
                // SAFETY: the stream is alive (borrowed) and capturing; the graph it gives back
                // is destroyed at once.
                if let Ok(graph) = unsafe { result::stream::end_capture(self.stream.cu_stream()) } {
                    if !graph.is_null() {
                        let _ = unsafe { result::graph::destroy(graph) };
                    }
                }
                let _ = self.stream.context().check_err();
            }
        }
    }

    // SAFETY: a graph may be launched from any thread (cudarc binds the context first); what
    // CUDA forbids is concurrent use of one graph, which the `&mut` of `replay` rules out (no
    // `Sync`). A generator holding graphs moves to its serving thread.
    unsafe impl Send for Captured {}

    impl Captured {
        pub(super) fn new(dev: &CudaDevice, run: &mut dyn FnMut() -> Result<Tensor>) -> Result<Self> {
            use candle_core::backend::BackendDevice;
            let _uploads = dev.enable_cuda_graph_htod_cache();
            drop(run()?);
            dev.synchronize()?;
            let stream = dev.cuda_stream();
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).w()?;
            // Ends the capture on every path out, a panic in `run` included, so that the
            // device's one stream never stays capturing.
            let mut open = OpenCapture { stream: &stream, open: true };
            let output = run();
            // Errors that drops recorded while the capture was invalid (cudarc keeps them for
            // the next call, which would then fail, `end_capture` first) belong to this
            // capture: cleared here; the capture's own outcome says what happened.
            let recorded = stream.context().check_err();
            open.open = false;
            let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
            let graph = stream.end_capture(flags);
            let _ = stream.context().check_err();
            let output = output?;
            let graph = graph.w()?;
            recorded.w()?;
            let Some(graph) = graph else { bail!("CUDA graph capture recorded nothing") };
            graph.upload().w()?;
            Ok(Self { graph, output })
        }

        pub(super) fn replay(&mut self) -> Result<Tensor> {
            self.graph.launch().w()?;
            Ok(self.output.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplayedForward;
    use candle_core::{Device, Tensor};

    /// The CPU twin replays by calling the forward: each replay sees the inputs' current
    /// values, as a graph launch reads its buffers' current contents.
    #[test]
    fn cpu_replays_rerun_the_forward_on_the_current_inputs() {
        let input = std::cell::Cell::new(1.0f32);
        let mut calls = 0;
        let mut replayed = ReplayedForward::capture(&Device::Cpu, || {
            calls += 1;
            Tensor::new(&[input.get(), 2.0 * input.get()], &Device::Cpu)
        })
        .unwrap();
        assert!(!replayed.is_graph());
        assert_eq!(replayed.replay().unwrap().to_vec1::<f32>().unwrap(), [1.0, 2.0]);
        input.set(3.0);
        assert_eq!(replayed.replay().unwrap().to_vec1::<f32>().unwrap(), [3.0, 6.0]);
        drop(replayed);
        assert_eq!(calls, 2, "the CPU twin runs nothing at capture");
    }
}
