package lab

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// The image archive must be what `ctr images import` accepts: a manifest
// naming the config and the layer, and a config whose diff_id is the
// layer's digest.
func TestImageArchiveIsADockerArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	if err := writeImage(out, "lab.local/x:dev", bin, "prog", []string{"/prog"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], _ = io.ReadAll(tr)
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, files["manifest.json"])
	}
	if manifest[0].RepoTags[0] != "lab.local/x:dev" || manifest[0].Layers[0] != "layer.tar" {
		t.Errorf("manifest %+v", manifest[0])
	}
	var config struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(files[manifest[0].Config], &config); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(files["layer.tar"])
	if want := "sha256:" + hex.EncodeToString(sum[:]); len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != want {
		t.Errorf("diff_ids %v, want [%s]", config.RootFS.DiffIDs, want)
	}
}
