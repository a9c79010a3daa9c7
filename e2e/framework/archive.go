package framework

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"time"
)

// File is one regular file of an image layer, or a directory when Path
// ends with a slash.
type File struct {
	Path string // inside the image, without a leading slash
	Data []byte
	Mode int64
}

// WriteImageArchive writes a one-layer image as a docker-archive tarball
// (manifest.json, config JSON, layer.tar), the format `ctr images import`
// reads, so tests can run containers without a registry.
func WriteImageArchive(path, ref string, entrypoint []string, files []File) error {
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	for _, f := range files {
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		if strings.HasSuffix(f.Path, "/") {
			if err := lw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: f.Path, Mode: mode, ModTime: epoch}); err != nil {
				return err
			}
			continue
		}
		if err := lw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: mode, Size: int64(len(f.Data)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := lw.Write(f.Data); err != nil {
			return err
		}
	}
	if err := lw.Close(); err != nil {
		return err
	}
	sum := sha256.Sum256(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": epoch.UTC(),
		"config": map[string]any{"Entrypoint": entrypoint, "Env": []string{"PATH=/"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(sum[:])}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{ref}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{"config.json", config}, {"layer.tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
