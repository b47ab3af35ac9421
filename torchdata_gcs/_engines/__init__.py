"""What many requests do together: parallel and shared listing, ordered downloads, composites, streaming
uploads (multipart and composite) and the writer base they share, compression, and streams over
downloaded bytes."""
