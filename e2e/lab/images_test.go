package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	files := tarEntries(t, data)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, files["manifest.json"])
	}
	if manifest[0].RepoTags[0] != "lab.local/x:dev" || len(manifest[0].Layers) != 1 {
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
	sum := sha256.Sum256(files[manifest[0].Layers[0]])
	if want := "sha256:" + hex.EncodeToString(sum[:]); len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != want {
		t.Errorf("diff_ids %v, want [%s]", config.RootFS.DiffIDs, want)
	}
}
