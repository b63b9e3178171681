"""Z-Image (runtime/models/zimage/): its single-stream diffusion transformer so far (`zimage_dit`, checked
against diffusers); the graph, its step-batching executor and the image endpoints come next."""
