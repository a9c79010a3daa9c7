package framework

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// File is one entry of an image layer: a regular file, a directory when
// Path ends with a slash, or a symbolic link to Link when Link is set.
type File struct {
	Path string // inside the image, without a leading slash
	Data []byte
	Mode int64
	Link string
	// Xattrs are extended attributes, e.g. security.capability.
	Xattrs map[string]string
}

// Layer is one filesystem layer of an image; images of one archive may
// share layers, which are then written once.
type Layer struct {
	Files []File

	tar    []byte
	diffID string
}

// Image is one image of an archive: its reference, its layers from the
// bottom up, and its run-time configuration.
type Image struct {
	Ref        string
	Layers     []*Layer
	Entrypoint []string
	Cmd        []string
	Env        []string // PATH=/ when empty
	WorkingDir string
}

// WriteImageArchive writes a one-layer image as a docker-archive tarball
// (manifest.json, config JSON, layer.tar), the format `ctr images import`
// reads, so tests can run containers without a registry.
func WriteImageArchive(path, ref string, entrypoint []string, files []File) error {
	return WriteImagesArchive(path, []Image{{Ref: ref, Layers: []*Layer{{Files: files}}, Entrypoint: entrypoint}})
}

// WriteImagesArchive writes several images into one docker-archive
// tarball, each shared layer once.
func WriteImagesArchive(path string, images []Image) error {
	var entries []archiveEntry
	written := map[*Layer]bool{}
	var manifest []map[string]any
	for i, img := range images {
		var diffIDs, layerNames []string
		for _, l := range img.Layers {
			if err := l.build(); err != nil {
				return fmt.Errorf("%s: %w", img.Ref, err)
			}
			name := l.diffID[len("sha256:"):] + "/layer.tar"
			if !written[l] {
				written[l] = true
				entries = append(entries, archiveEntry{name, l.tar})
			}
			diffIDs = append(diffIDs, l.diffID)
			layerNames = append(layerNames, name)
		}
		env := img.Env
		if len(env) == 0 {
			env = []string{"PATH=/"}
		}
		cfg := map[string]any{"Entrypoint": img.Entrypoint, "Env": env}
		if img.Cmd != nil {
			cfg["Cmd"] = img.Cmd
		}
		if img.WorkingDir != "" {
			cfg["WorkingDir"] = img.WorkingDir
		}
		config, err := json.Marshal(map[string]any{
			"architecture": "amd64", "os": "linux", "created": time.Unix(0, 0).UTC(),
			"config": cfg,
			"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
		})
		if err != nil {
			return err
		}
		configName := fmt.Sprintf("config-%d.json", i)
		entries = append(entries, archiveEntry{configName, config})
		manifest = append(manifest, map[string]any{"Config": configName, "RepoTags": []string{img.Ref}, "Layers": layerNames})
	}
	m, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	return writeArchive(path, append(entries, archiveEntry{"manifest.json", m}))
}

// archiveEntry is one file of a docker-archive tarball.
type archiveEntry struct {
	name string
	data []byte
}

// writeArchive writes entries into a tarball at path, each in its folder,
// with no time of this machine in it, and renames it into place only when
// whole.
func writeArchive(path string, entries []archiveEntry) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	epoch := time.Unix(0, 0)
	for _, e := range entries {
		if strings.Contains(e.name, "/") {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: e.name[:strings.Index(e.name, "/")+1], Mode: 0o755, ModTime: epoch}); err != nil {
				f.Close()
				return err
			}
		}
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

// build renders the layer's tarball once.
func (l *Layer) build() error {
	if l.tar != nil {
		return nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, f := range l.Files {
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: mode, Size: int64(len(f.Data)), ModTime: epoch}
		switch {
		case f.Link != "":
			h = &tar.Header{Typeflag: tar.TypeSymlink, Name: f.Path, Linkname: f.Link, Mode: 0o777, ModTime: epoch}
		case strings.HasSuffix(f.Path, "/"):
			h = &tar.Header{Typeflag: tar.TypeDir, Name: f.Path, Mode: mode, ModTime: epoch}
		}
		if len(f.Xattrs) > 0 {
			h.Format, h.PAXRecords = tar.FormatPAX, map[string]string{}
			for k, v := range f.Xattrs {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	sum := sha256.Sum256(buf.Bytes())
	l.tar, l.diffID = buf.Bytes(), "sha256:"+hex.EncodeToString(sum[:])
	return nil
}
