export const PACKAGE_NAME = "@tapwire/testing";
